//! `migres.read_first`: a small model seldom judges its own facts sufficient, so the loop ran to its
//! limit on most questions and answered from facts instead of from the passages a one-shot reader
//! sees. Here the first read's answer ends the question unless a check that does not ask the model
//! finds it unsupported, and when the loop runs, its answer replaces the first read's only when the
//! loop's evidence writes it and the first read's passages do not.

use crate::actors::shared::answer::{FinalAnswer, contains_words, normalize_answer};
use crate::actors::shared::{named_pair, two_options};
use crate::config::GoOnWhen;
use crate::topics::{Memory, OneShot, Passage, TraceKind};

/// First words of a question that wants yes or no, unless it names two options.
const AUXILIARIES: &[&str] =
    &["is", "are", "was", "were", "do", "does", "did", "can", "could", "has", "have", "had", "will", "would", "should"];

const NUMBER_WORDS: &[&str] = &["one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten"];

/// Words of a yes-or-no question that name two things it asks about together.
const TOGETHER: &[&str] = &["both", "same", "share", "shared", "common", "and"];

/// Phrases (between spaces, lower case) of a question that asks for a place, besides a first "where".
const PLACE_PHRASES: &[&str] = &[
    "place of birth",
    "place of death",
    "born in what",
    "in what city",
    "in what country",
    "in what county",
    "in what state",
    "in what town",
];
/// Nouns of a place after "which" or "what" ("which county", "what city").
const PLACE_NOUNS: &[&str] = &["city", "country", "county", "state", "town", "island", "river", "province"];
/// Phrases of a question that asks for a date, besides a first "when".
const DATE_PHRASES: &[&str] = &["what year", "which year", "what date", "date of birth", "date of death", "birthday"];
/// Phrases of a question that asks for a number, besides a first "how many", "how much", "how old".
const NUMBER_PHRASES: &[&str] = &["what percentage", "population"];

/// What a question asks for, by its words, as far as the `asks_*` checks need it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Asks {
    Place,
    Date,
    Number,
}

/// The kind of answer a question asks for, when it is a place, a date or a number; None for a
/// yes-or-no question, one offering two options, and anything else. A place comes first ("When was
/// the place of birth ...?" never reads so; "In what city ... born in 1950?" asks a place).
pub fn asks(question: &str) -> Option<Asks> {
    let q = question.trim().to_lowercase();
    let words: Vec<&str> = q.split(|c: char| !c.is_alphanumeric()).filter(|w| !w.is_empty()).collect();
    let first = *words.first()?;
    if AUXILIARIES.contains(&first) || two_options::options(question).is_some() {
        return None;
    }
    let text = format!(" {} ", words.join(" "));
    let has = |phrases: &[&str]| phrases.iter().any(|p| text.contains(&format!(" {p} ")));
    let place_noun = words.windows(2).any(|w| matches!(w[0], "which" | "what") && PLACE_NOUNS.contains(&w[1]));
    if first == "where" || has(PLACE_PHRASES) || place_noun {
        return Some(Asks::Place);
    }
    if first == "when" || has(DATE_PHRASES) {
        return Some(Asks::Date);
    }
    let how = matches!(words.get(..2), Some(["how", "many" | "much" | "old"]));
    (how || has(NUMBER_PHRASES)).then_some(Asks::Number)
}

impl Asks {
    /// The check that sends a question asking for this on.
    fn check(self) -> GoOnWhen {
        match self {
            Asks::Place => GoOnWhen::AsksPlace,
            Asks::Date => GoOnWhen::AsksDate,
            Asks::Number => GoOnWhen::AsksNumber,
        }
    }
}

/// Checks that send a question on for what it asks or how sure its read was, not for a fault of
/// its answer: the loop's answer then wins wherever its evidence writes it.
const SENT_WHATEVER_ITS_ANSWER: [GoOnWhen; 5] =
    [GoOnWhen::AsksPlace, GoOnWhen::AsksDate, GoOnWhen::AsksNumber, GoOnWhen::Unsure, GoOnWhen::OptionUnseen];

/// The checks of `checks` that find `answer` to the memory's question unsupported, by name, for the
/// trace: `shown` are the passages the read showed, whole.
pub fn reasons_to_go_on(checks: &[GoOnWhen], memory: &Memory, answer: &str, shown: &[Passage]) -> Vec<String> {
    let texts = texts_of(shown);
    // As the reader was asked it (a yes-or-no question carries its instruction): what the first
    // checks were designed on. The yes-or-no check reads the question alone.
    let asked = memory.question_to_answer();
    let fails = |check: &GoOnWhen| match check {
        GoOnWhen::Ungrounded => !written_in(answer, &texts),
        GoOnWhen::WrongType => !fits_type(&asked, answer),
        GoOnWhen::NotAnOption => !names_one_option(&asked, answer),
        GoOnWhen::YesNoOfTwo => asks_yes_no_of_two(&memory.question),
        GoOnWhen::AsksPlace | GoOnWhen::AsksDate | GoOnWhen::AsksNumber => {
            asks(&memory.question).map(Asks::check) == Some(*check)
        }
        GoOnWhen::OptionUnseen => an_option_unseen(&memory.question, shown),
        // Needs the read's log-probabilities: the caller adds it (`unsure`).
        GoOnWhen::Unsure => false,
    };
    checks.iter().filter(|c| fails(c)).map(|c| c.name().to_string()).collect()
}

/// The question names two things ([`named_pair::named_pair`]), and no passage of `shown` is titled
/// with one of them: the read compared or joined two things having seen only one.
pub fn an_option_unseen(question: &str, shown: &[Passage]) -> bool {
    let Some(pair) = named_pair::named_pair(question) else { return false };
    let titles: Vec<String> = shown.iter().map(|p| normalize_answer(&p.title)).filter(|t| !t.is_empty()).collect();
    let seen = |name: &str| {
        let name = normalize_answer(name);
        titles.iter().any(|title| contains_words(title, &name) || contains_words(&name, title))
    };
    !(seen(&pair.first) && seen(&pair.second))
}

/// A yes-or-no question (its first word an auxiliary, no two options offered) about two things
/// together: "Are A and B both ...?", "Do the directors of A and B share ...?".
pub fn asks_yes_no_of_two(question: &str) -> bool {
    let q = question.trim().to_lowercase();
    let words: Vec<&str> = q.split(|c: char| !c.is_alphanumeric()).filter(|w| !w.is_empty()).collect();
    let Some(first) = words.first() else { return false };
    // No "or": two options offered ("Was A or B born first?") are `not_an_option`'s.
    AUXILIARIES.contains(first) && !words.contains(&"or") && words.iter().any(|w| TOGETHER.contains(w))
}

/// Each passage as the checks read it: its title, then its text.
pub fn texts_of<'a>(passages: impl IntoIterator<Item = &'a Passage>) -> Vec<String> {
    passages.into_iter().map(|p| format!("{} {}", p.title, p.text)).collect()
}

/// Some text writes the answer's words in a row, normalised as scoring does; yes and no pass, since
/// no passage writes them.
pub fn written_in(answer: &str, texts: &[String]) -> bool {
    let answer = normalize_answer(answer);
    if answer.is_empty() {
        return false;
    }
    matches!(answer.as_str(), "yes" | "no") || texts.iter().any(|t| contains_words(&normalize_answer(t), &answer))
}

/// The answer is of the kind the question's first words ask for.
pub fn fits_type(question: &str, answer: &str) -> bool {
    let (q, a) = (question.trim().to_lowercase(), normalize_answer(answer));
    if a.is_empty() {
        return false;
    }
    let yes_no = matches!(a.as_str(), "yes" | "no");
    let first = q.split_whitespace().next().unwrap_or("");
    if AUXILIARIES.contains(&first) {
        return yes_no || q.contains(" or ");
    }
    let has_digit = a.chars().any(|c| c.is_ascii_digit());
    if q.starts_with("when") || ["what year", "which year", "what date"].iter().any(|w| q.contains(w)) {
        return has_digit;
    }
    if ["how many", "how much", "how old"].iter().any(|w| q.starts_with(w)) {
        return has_digit || a.split(' ').any(|w| NUMBER_WORDS.contains(&w));
    }
    !yes_no && !matches!(a.as_str(), "unknown" | "none")
}

/// A two-option question is answered with one option (its words in a row), not neither or both; a
/// yes or no passes ("Are A and B both ...?"), and so does any answer to other questions.
pub fn names_one_option(question: &str, answer: &str) -> bool {
    matches!(normalize_answer(answer).as_str(), "yes" | "no")
        || names_exactly_one_option(question, answer) != Some(false)
}

/// Whether the answer names exactly one of the two options the question offers (a yes or no names
/// none); None for a question that offers no two options.
pub fn names_exactly_one_option(question: &str, answer: &str) -> Option<bool> {
    let options = two_options::options(question)?;
    let a = normalize_answer(answer);
    let names = |option: &str| !a.is_empty() && contains_words(&normalize_answer(option), &a);
    Some(names(&options.first) != names(&options.second))
}

/// How the final answer is chosen between the first read's and the loop's.
#[derive(Clone, Copy, Debug, Default)]
pub struct Choice<'a> {
    /// `migres.read_first_goes_on_when`.
    pub checks: &'a [GoOnWhen],
    /// `migres.ends_with_an_option`.
    pub ends_with_an_option: bool,
}

/// The final answer: the loop's `given` when the loop's evidence (`loop_texts`: its verified facts and
/// the passages they cite) writes it and the first read's passages do not write the first read's;
/// otherwise the first read's, whose passages then join the answer's citations. With the
/// `yes_no_of_two` check among the checks, such a question's loop answers it when the loop says yes
/// or no: no text writes either, and the loop looked both things up. With `ends_with_an_option`, a
/// two-option question takes whichever of the two answers alone names one option: the first read
/// named the director of one film, the loop the film. With an `asks_*` check that sent the question
/// on for what it asks, or by `unsure`, the loop's answer wins wherever the loop's evidence writes it
/// and it is of the kind asked.
pub fn choose(
    memory: &mut Memory,
    stage: &str,
    given: FinalAnswer,
    loop_texts: &[String],
    choice: Choice,
) -> FinalAnswer {
    let Some(one_shot) = memory.one_shot.take() else { return given };
    let yes_no_of_two = choice.checks.contains(&GoOnWhen::YesNoOfTwo) && asks_yes_no_of_two(&memory.question);
    let asked = memory.question_to_answer();
    let one_option = |answer: &str| names_exactly_one_option(&asked, answer).filter(|_| choice.ends_with_an_option);
    let loop_wins = match (one_option(&one_shot.answer), one_option(&given.answer)) {
        (Some(first), Some(looped)) if first != looped => looped,
        _ if yes_no_of_two => matches!(normalize_answer(&given.answer).as_str(), "yes" | "no"),
        // Sent on for what it asks, not for a fault of its answer: the loop's answer wins wherever
        // its evidence writes it and it is of the kind asked ("Vatican City" answers no "when").
        _ if SENT_WHATEVER_ITS_ANSWER.iter().any(|c| one_shot.went_on.iter().any(|w| w == c.name())) => {
            written_in(&given.answer, loop_texts) && fits_type(&asked, &given.answer)
        }
        _ => written_in(&given.answer, loop_texts) && !written_in(&one_shot.answer, &texts_of(&one_shot.passages)),
    };
    let OneShot { answer, confidence, explanation, passages, .. } = one_shot;
    let chosen = if loop_wins { given.answer.clone() } else { answer.clone() };
    memory.record(
        stage,
        TraceKind::OneShotOrLoop { one_shot: answer.clone(), loop_answer: given.answer.clone(), chosen },
    );
    if loop_wins {
        return given;
    }
    for passage in passages {
        memory.cited_passages.insert(passage.id.clone(), passage);
    }
    let explanation = format!(
        "{explanation} (Read once from the best passages; the loop's answer, {}, had no better support.)",
        given.answer
    );
    FinalAnswer { answer, confidence, explanation }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn texts(list: &[&str]) -> Vec<String> {
        list.iter().map(|t| t.to_string()).collect()
    }

    #[test]
    fn an_answer_is_grounded_where_a_passage_writes_its_words_in_a_row() {
        let shown = texts(&["Tom Quill (born 1961 in Lindon, Vessary) is a goalkeeper."]);
        assert!(written_in("Lindon, Vessary", &shown));
        assert!(written_in("the Lindon", &shown), "normalised as scoring does");
        assert!(!written_in("Vessary Lindon", &shown), "words in another order");
        assert!(!written_in("Lind", &shown), "part of a word is not the word");
        assert!(written_in("No", &shown), "no passage writes yes or no");
        assert!(!written_in("", &shown));
    }

    #[test]
    fn the_answer_must_be_of_the_kind_asked_for() {
        assert!(fits_type("When was Tom Quill born?", "12 May 1961"));
        assert!(!fits_type("When was Tom Quill born?", "Lindon"));
        assert!(!fits_type("In what year did the club win?", "the league"));
        assert!(fits_type("How many goals did he score?", "seven"));
        assert!(!fits_type("How many goals did he score?", "many"));
        assert!(fits_type("Did Tom Quill play for Lindon?", "yes"));
        assert!(!fits_type("Did Tom Quill play for Lindon?", "Tom Quill"));
        assert!(fits_type("Was Tom Quill or Ada Brand born first?", "Ada Brand"));
        assert!(!fits_type("Who founded Lindon?", "yes"));
        assert!(!fits_type("Who founded Lindon?", "unknown"));
    }

    #[test]
    fn a_two_option_question_wants_exactly_one_option() {
        let question = "Which film came out first, The Blue Door or Night Train?";
        assert!(names_one_option(question, "The Blue Door"));
        assert!(names_one_option(question, "Night Train"));
        assert!(!names_one_option(question, "Lindon"), "neither option");
        assert!(names_one_option("Who founded Lindon?", "Lindon"), "not a two-option question");
    }

    #[test]
    fn a_yes_or_no_question_about_two_things_is_told_apart() {
        assert!(asks_yes_no_of_two("Are Sutera and Rhodotypos both types of shrub?"));
        assert!(asks_yes_no_of_two("Were the Commodore 16 and Prológica CP-400 from the same country?"));
        assert!(asks_yes_no_of_two("Do the directors of Kaalapani and Neutral Port share a nationality?"));
        assert!(!asks_yes_no_of_two("Did Tom Quill play for Lindon?"), "one thing");
        assert!(!asks_yes_no_of_two("Was Jamie Curry or Alyaksey Vasilewski born first?"), "two options");
        assert!(!asks_yes_no_of_two("Who were both founders of Lindon and Vessary?"), "not yes or no");
        assert!(!asks_yes_no_of_two(""));
    }

    #[test]
    fn the_yes_no_of_two_check_sends_such_a_question_on_whatever_its_answer() {
        let mut memory = Memory::new("q", "Are Sutera and Rhodotypos both types of shrub?");
        memory.yes_no = true;
        let checks = [GoOnWhen::Ungrounded, GoOnWhen::WrongType, GoOnWhen::NotAnOption];
        assert!(reasons_to_go_on(&checks, &memory, "yes", &[]).is_empty(), "off by default: a yes passes");
        let on = [GoOnWhen::Ungrounded, GoOnWhen::YesNoOfTwo];
        assert_eq!(reasons_to_go_on(&on, &memory, "yes", &[]), ["yes_no_of_two"]);
        let one = Memory::new("q", "Did Tom Quill play for Lindon?");
        assert!(reasons_to_go_on(&on, &one, "no", &[]).is_empty());
    }

    #[test]
    fn with_the_yes_no_of_two_check_the_loop_answers_such_a_question_when_it_says_yes_or_no() {
        let question = "Were the Commodore 16 and Prológica CP-400 from the same country?";
        let with_first_read = |answer: &str| first_read(question, answer, "The Commodore 16 is a home computer.", &[]);
        let on = [GoOnWhen::Ungrounded, GoOnWhen::YesNoOfTwo];
        assert_eq!(
            choose(&mut with_first_read("Yes"), "main", given("No"), &[], Choice { checks: &on, ..Choice::default() })
                .answer,
            "No"
        );
        assert_eq!(
            choose(
                &mut with_first_read("Yes"),
                "main",
                given("unanswerable"),
                &[],
                Choice { checks: &on, ..Choice::default() }
            )
            .answer,
            "Yes"
        );
        // Without the check, as before: a yes or no is "written" anywhere, so the first read stays.
        let off = [GoOnWhen::Ungrounded, GoOnWhen::WrongType, GoOnWhen::NotAnOption];
        assert_eq!(
            choose(&mut with_first_read("Yes"), "main", given("No"), &[], Choice { checks: &off, ..Choice::default() })
                .answer,
            "Yes"
        );
    }

    fn memory_with_one_shot(answer: &str, passage: &str) -> Memory {
        first_read("Where was the goalkeeper of Harwick Rovers born?", answer, passage, &[])
    }

    /// A memory of `question` whose first read answered `answer` from `passage` and was sent round
    /// the loop by the checks named in `went_on`.
    fn first_read(question: &str, answer: &str, passage: &str, went_on: &[&str]) -> Memory {
        let mut memory = Memory::new("q", question);
        memory.one_shot = Some(OneShot {
            answer: answer.into(),
            confidence: 4.0,
            explanation: "read".into(),
            passages: vec![crate::topics::Passage {
                id: "p1".into(),
                title: "Harwick Rovers".into(),
                text: passage.into(),
            }],
            went_on: went_on.iter().map(|w| w.to_string()).collect(),
        });
        memory
    }

    fn given(answer: &str) -> FinalAnswer {
        FinalAnswer { answer: answer.into(), confidence: 3.0, explanation: "loop".into() }
    }

    #[test]
    fn the_loop_replaces_the_first_read_only_with_better_support() {
        let loop_texts = texts(&["Tom Quill was born in Lindon."]);
        // The first read named someone its passages never mention; the loop's facts write Lindon.
        let mut memory = memory_with_one_shot("Vessary", "Harwick Rovers' goalkeeper is Tom Quill.");
        assert_eq!(choose(&mut memory, "main", given("Lindon"), &loop_texts, Choice::default()).answer, "Lindon");
        assert!(memory.one_shot.is_none());
        assert!(
            memory
                .trace
                .iter()
                .any(|s| matches!(&s.kind, TraceKind::OneShotOrLoop { chosen, .. } if chosen == "Lindon"))
        );
        // Both supported: a tie keeps the first read, whose passage becomes a citation.
        let mut memory = memory_with_one_shot("Tom Quill", "Harwick Rovers' goalkeeper is Tom Quill.");
        let chosen = choose(&mut memory, "main", given("Lindon"), &loop_texts, Choice::default());
        assert_eq!(chosen.answer, "Tom Quill");
        assert!(memory.cited_passages.contains_key("p1"));
        // Neither supported: a tie too.
        let mut memory = memory_with_one_shot("Vessary", "Harwick Rovers' goalkeeper is Tom Quill.");
        assert_eq!(choose(&mut memory, "main", given("Ostra"), &loop_texts, Choice::default()).answer, "Vessary");
        // No first read in the memory: the loop's answer, untouched.
        let mut memory = Memory::new("q", "?");
        assert_eq!(choose(&mut memory, "main", given("Lindon"), &loop_texts, Choice::default()).explanation, "loop");
    }

    #[test]
    fn with_ends_with_an_option_the_answer_naming_one_option_wins() {
        let question = "Which film has the director born earlier, Lone Tarn or Harrow Lights?";
        let with_first_read =
            |answer: &str| first_read(question, answer, "Lone Tarn is a film directed by Cal Verrin.", &[]);
        let on = Choice { ends_with_an_option: true, ..Choice::default() };
        // The first read named the director (written in its passage), the loop a film (written nowhere).
        assert_eq!(choose(&mut with_first_read("Cal Verrin"), "main", given("Lone Tarn"), &[], on).answer, "Lone Tarn");
        assert_eq!(
            choose(&mut with_first_read("Cal Verrin"), "main", given("Lone Tarn"), &[], Choice::default()).answer,
            "Cal Verrin"
        );
        // The first read named an option its passage does not write, and the loop a name its evidence
        // writes: without the lever the loop's wins, with it the option stays.
        let loop_texts = texts(&["Cal Verrin was born in 1931."]);
        let read =
            |choice| choose(&mut with_first_read("Harrow Lights"), "main", given("Cal Verrin"), &loop_texts, choice);
        assert_eq!(read(Choice::default()).answer, "Cal Verrin");
        assert_eq!(read(on).answer, "Harrow Lights");
        // Both name an option: as without the lever.
        assert_eq!(
            choose(&mut with_first_read("Lone Tarn"), "main", given("Harrow Lights"), &[], on).answer,
            "Lone Tarn"
        );
    }

    #[test]
    fn what_a_question_asks_for_is_read_from_its_words() {
        let place = [
            "Where was the father of Lope Díaz Ii De Haro born?",
            "What is the place of birth of the director of film Boden'S Boy?",
            "Politician Lyman Sherwood was born in what New York county?",
            "Which country the director of film The White Countess is from?",
            "In which county is the city sharing a border with the capitol of the state?",
        ];
        let date = [
            "When did Frances Vane, Marchioness Of Londonderry's father die?",
            "What is the date of birth of Archibald Montgomerie's father?",
            "What year was the 2nd wife of the leader of the hussites born?",
        ];
        let number =
            ["How many records did Shane Lynch sell as a member of Boyzone?", "What was the population of the town?"];
        let none = [
            "Who is the father of William Ii, Duke Of Bavaria?",
            "Which film came out first, Oloibiri (Film) or The Eagle'S Claw?",
            "Were the Commodore 16 and Prológica CP-400 from the same country?",
            "Was Jovita Carranza or Fidel Kuri Grajales born first?",
            "",
        ];
        for (questions, wanted) in [
            (&place[..], Some(Asks::Place)),
            (&date[..], Some(Asks::Date)),
            (&number[..], Some(Asks::Number)),
            (&none[..], None),
        ] {
            for q in questions {
                assert_eq!(asks(q), wanted, "{q}");
            }
        }
    }

    #[test]
    fn with_an_asks_check_the_loop_answers_what_it_sent_on_when_its_evidence_writes_it() {
        let passage = "Tom Quill is the son of Ben Quill of Harwick.";
        // Sent on, as the sentence filter sends it, by whichever of `checks` find it unsupported.
        let sent_on = |question: &str, answer: &str, checks: &[GoOnWhen]| {
            let mut memory = first_read(question, answer, passage, &[]);
            let shown = memory.one_shot.as_ref().unwrap().passages.clone();
            let went_on = reasons_to_go_on(checks, &memory, answer, &shown);
            memory.one_shot.as_mut().unwrap().went_on = went_on;
            memory
        };
        let question = "Where was the father of Tom Quill born?";
        let checks = [GoOnWhen::Ungrounded, GoOnWhen::AsksPlace];
        let with_first_read = |answer: &str| sent_on(question, answer, &checks);
        assert_eq!(with_first_read("Harwick").one_shot.unwrap().went_on, ["asks_place"]);
        let on = Choice { checks: &checks, ..Choice::default() };
        let loop_texts = texts(&["Ben Quill was born in Lindon."]);
        // The first read's answer is written in its passage, yet the loop's, written in its evidence, wins.
        assert_eq!(choose(&mut with_first_read("Harwick"), "main", given("Lindon"), &loop_texts, on).answer, "Lindon");
        assert_eq!(choose(&mut with_first_read("Harwick"), "main", given("Ostra"), &loop_texts, on).answer, "Harwick");
        // Of the wrong kind for a "when": the first read stays.
        let mut when = sent_on("When was the father of Tom Quill born?", "1931", &[GoOnWhen::AsksDate]);
        let on = Choice { checks: &[GoOnWhen::AsksDate], ..Choice::default() };
        assert_eq!(choose(&mut when, "main", given("Ben Quill"), &texts(&["Ben Quill"]), on).answer, "1931");
        let off = [GoOnWhen::Ungrounded];
        assert_eq!(
            choose(
                &mut sent_on(question, "Harwick", &off),
                "main",
                given("Lindon"),
                &loop_texts,
                Choice { checks: &off, ..Choice::default() }
            )
            .answer,
            "Harwick"
        );
    }

    #[test]
    fn a_read_that_saw_one_of_two_named_things_is_sent_on() {
        let page = |title: &str| crate::topics::Passage { id: title.into(), title: title.into(), text: "...".into() };
        let question = "Which film came out first, Lone Tarn or Harrow Lights?";
        let checks = [GoOnWhen::OptionUnseen];
        let memory = Memory::new("q", question);
        let went_on = |shown: &[crate::topics::Passage]| reasons_to_go_on(&checks, &memory, "Lone Tarn", shown);
        assert_eq!(went_on(&[page("Lone Tarn (film)"), page("Cal Verrin")]), ["option_unseen"]);
        assert!(went_on(&[page("Lone Tarn (film)"), page("Harrow Lights")]).is_empty(), "both titled");
        let both = Memory::new("q", "Are the Vessary Hound and Lindon Terrier both dogs?");
        let shown = [page("Vessary Hound"), page("Ostra")];
        assert_eq!(reasons_to_go_on(&checks, &both, "yes", &shown), ["option_unseen"]);
        let one = Memory::new("q", "Where was the father of Tom Quill born?");
        assert!(reasons_to_go_on(&checks, &one, "Lindon", &[page("Ostra")]).is_empty(), "names no two things");
    }

    #[test]
    fn a_first_read_sent_on_as_unsure_yields_to_a_loop_answer_its_evidence_writes() {
        let sent_on = |unsure: bool| {
            let went_on = if unsure { "unsure" } else { "ungrounded" };
            first_read(
                "Where was the father of Tom Quill born?",
                "Harwick",
                "Tom Quill is the son of Ben Quill of Harwick.",
                &[went_on],
            )
        };
        let on = Choice { checks: &[GoOnWhen::Unsure], ..Choice::default() };
        let loop_texts = texts(&["Tom Quill was born in Lindon."]);
        assert_eq!(choose(&mut sent_on(true), "main", given("Lindon"), &loop_texts, on).answer, "Lindon");
        // Sent on for another reason: the first read's passage writes its answer, so it stays.
        assert_eq!(choose(&mut sent_on(false), "main", given("Lindon"), &loop_texts, on).answer, "Harwick");
    }
}
