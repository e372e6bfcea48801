//! two_options: questions that ask which of two named options comes first or last, or has more or
//! less of something ("Which film came out first, A or B?"). On 2WikiMultihopQA the 1.5B model held
//! both dates among its verified facts and still compared them the wrong way ("Kotsch died 1884",
//! "Walther died 2006" -> "Walther died earlier"), or answered with neither option (the director's
//! name). So the model is only asked to copy each option's date or number, and the comparison is made
//! here; an answer naming neither option is mapped to the one a verified fact links it to. What this
//! cannot settle keeps the model's answer.

use schemars::JsonSchema;
use serde::Deserialize;

use crate::actors::clients::{LlmClient, LlmError, Schema};
use crate::actors::prompts;
use crate::actors::shared::accounting::{degrade, note_call};
use crate::actors::shared::answer::{contains_words, normalize_answer};
use crate::topics::{Memory, TraceKind};

/// The two options a question names, as it writes them.
#[derive(Debug, PartialEq)]
pub struct Options {
    pub first: String,
    pub second: String,
}

/// Which end of the comparison the question asks for.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Wanted {
    /// Earlier, first, older (born earlier), fewer, lower.
    Least,
    /// Later, more recently, younger, more, higher.
    Most,
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Measure {
    Date,
    Number,
}

#[derive(Clone, Copy, Debug, PartialEq)]
struct Comparison {
    wanted: Wanted,
    measure: Measure,
}

const TEMPORAL_LEAST: &[&str] = &["earlier", "earliest", "first", "before", "older", "oldest", "sooner"];
const TEMPORAL_MOST: &[&str] =
    &["later", "latest", "last", "after", "younger", "youngest", "recently", "recent", "newer", "newest"];
const NUMBER_LEAST: &[&str] =
    &["fewer", "fewest", "less", "least", "lower", "lowest", "smaller", "smallest", "shorter", "shortest"];
const NUMBER_MOST: &[&str] = &[
    "more", "most", "higher", "highest", "larger", "largest", "bigger", "biggest", "taller", "tallest", "longer",
    "longest", "greater", "greatest",
];
/// A lifespan is computed from two dates, not copied: such questions are left to the model.
const COMPUTED: &[&str] = &["lived", "live", "life", "lives", "age", "aged"];

const MONTHS: &[&str] = &[
    "january",
    "february",
    "march",
    "april",
    "may",
    "june",
    "july",
    "august",
    "september",
    "october",
    "november",
    "december",
];

/// Words no name of a thing contains but the rest of a question does ("... SM is awarded in what
/// field"): an option with one of them is part of the question's sentence, not a name.
const SENTENCE_WORDS: &[&str] = &[
    "is", "are", "was", "were", "what", "which", "who", "whom", "whose", "where", "when", "how", "why", "did", "does",
    "do", "has", "have", "had",
];

/// Words that may join the capitalised words of a name ("Museum of Lithuanian Culture").
pub(super) const NAME_JOINERS: &[&str] =
    &["of", "the", "de", "del", "la", "le", "van", "von", "der", "and", "&", "in", "on"];

/// Options of "Which film came out first, A or B?" (the stem before the first comma names neither)
/// and of "Was A or B born first?" (the second option is the run of capitalised words after "or").
/// Exactly two, each a name: None for a list of three or more ("..., A, B, or C") and for words of
/// the question's own sentence ("abbreviated A or B in what field").
pub fn options(question: &str) -> Option<Options> {
    let q = question.trim().trim_end_matches('?').trim_end();
    if let Some((stem, rest)) = q.split_once(", ")
        && !stem.contains(" or ")
    {
        let (first, second) = rest.split_once(" or ")?;
        // "A, B, or C", or a stem ending in a name ("abbreviated A, B, or C"): a list, not a pair.
        // ("..., DC Talk, or Manchester Orchestra" is a pair: one name before the serial comma.)
        let serial = first.trim_end().strip_suffix(',');
        if let Some(before) = serial
            && (before.contains(", ") || stem.split_whitespace().last().is_some_and(is_name_word))
        {
            return None;
        }
        return Options::new(first, second);
    }
    let (head, tail) = q.split_once(" or ")?;
    let (auxiliary, first) = head.split_once(' ')?;
    let auxiliaries = ["was", "is", "were", "are", "did", "does", "do", "has", "have"];
    if !auxiliaries.contains(&auxiliary.to_lowercase().as_str()) {
        return None;
    }
    Options::new(first, &capitalised_run(tail))
}

impl Options {
    pub(super) fn new(first: &str, second: &str) -> Option<Options> {
        let clean = |s: &str| s.trim().trim_end_matches(',').trim().to_string();
        let (first, second) = (clean(first), clean(second));
        let plausible = |s: &str| !normalize_answer(s).is_empty() && s.split_whitespace().count() <= 12 && is_name(s);
        (plausible(&first) && plausible(&second)).then_some(Options { first, second })
    }
}

/// A word that starts a name: capitalised, or a number.
pub(super) fn is_name_word(word: &str) -> bool {
    word.trim_start_matches(|c: char| !c.is_alphanumeric())
        .chars()
        .next()
        .is_some_and(|c| c.is_uppercase() || c.is_ascii_digit())
}

/// Text that reads as a name: it starts with a capital or a number, and none of its words is one of
/// the question's sentence written in lower case ("... SM is awarded in what field"; a title's own
/// "What Will You Do" is capitalised).
fn is_name(text: &str) -> bool {
    let mut words = text.split_whitespace().map(|w| w.trim_matches(|c: char| !c.is_alphanumeric()));
    let starts = text.split_whitespace().next().is_some_and(is_name_word);
    starts && !words.any(|w| SENTENCE_WORDS.contains(&w))
}

/// The two options of a question that compares them ("Which came out first, A or B?"): two names
/// and a comparative outside them. None for anything else, which is left to the model.
fn compared_options(question: &str) -> Option<(Options, Comparison)> {
    let options = options(question)?;
    let comparison = comparison(question, &options)?;
    Some((options, comparison))
}

/// The leading words of `text` that make a name: capitalised or numbered words, with joiners between
/// them; a comma ends it.
pub(super) fn capitalised_run(text: &str) -> String {
    let mut taken: Vec<&str> = Vec::new();
    let mut pending: Vec<&str> = Vec::new();
    for word in text.split_whitespace() {
        let bare = word.trim_end_matches(',');
        let capital = bare.chars().next().is_some_and(|c| c.is_uppercase() || c.is_ascii_digit());
        if capital {
            taken.append(&mut pending);
            taken.push(bare);
            if bare.len() != word.len() {
                break;
            }
        } else if !taken.is_empty() && NAME_JOINERS.contains(&bare.to_lowercase().as_str()) {
            pending.push(bare);
        } else {
            break;
        }
    }
    taken.join(" ")
}

/// What the question compares, from its words outside the options ("The Life Of Na Woon-Gyu" names
/// a film, not a lifespan): a temporal word ("earlier", "more recently") makes it a comparison of
/// dates, otherwise a quantity word ("more", "higher") one of numbers. None when it names both ends,
/// or a lifespan.
fn comparison(question: &str, options: &Options) -> Option<Comparison> {
    let stem = question.replace(&options.first, " ").replace(&options.second, " ");
    let normalized = normalize_answer(&stem);
    let words: Vec<&str> = normalized.split(' ').collect();
    let has = |list: &[&str]| words.iter().any(|w| list.contains(w));
    if has(COMPUTED) {
        return None;
    }
    let pick = |least: &[&str], most: &[&str], measure| match (has(least), has(most)) {
        (true, false) => Some(Comparison { wanted: Wanted::Least, measure }),
        (false, true) => Some(Comparison { wanted: Wanted::Most, measure }),
        _ => None,
    };
    if has(TEMPORAL_LEAST) || has(TEMPORAL_MOST) {
        return pick(TEMPORAL_LEAST, TEMPORAL_MOST, Measure::Date);
    }
    pick(NUMBER_LEAST, NUMBER_MOST, Measure::Number)
}

/// A date as far as the text gives it: year, then month and day when written. One year only: a
/// range ("1901 – 1979") says nothing about which end the question means.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Date {
    year: i32,
    month: Option<u32>,
    day: Option<u32>,
}

fn tokens(text: &str) -> Vec<String> {
    text.to_lowercase().split(|c: char| !c.is_alphanumeric()).filter(|t| !t.is_empty()).map(str::to_string).collect()
}

fn parse_date(text: &str) -> Option<Date> {
    let tokens = tokens(text);
    if tokens.iter().any(|t| t == "bc" || t == "bce") {
        return None;
    }
    let numbers: Vec<&String> = tokens.iter().filter(|t| t.chars().all(|c| c.is_ascii_digit())).collect();
    let years: Vec<i32> =
        numbers.iter().filter(|t| (3..=4).contains(&t.len())).filter_map(|t| t.parse().ok()).collect();
    let [year] = years[..] else { return None };
    let month = tokens
        .iter()
        .find_map(|t| MONTHS.iter().position(|m| t.chars().count() >= 3 && m.starts_with(t.as_str())))
        .map(|i| i as u32 + 1);
    let days: Vec<u32> = numbers
        .iter()
        .filter(|t| t.len() <= 2)
        .filter_map(|t| t.parse().ok())
        .filter(|d| (1..=31).contains(d))
        .collect();
    let day = match (month, &days[..]) {
        (Some(_), [day]) => Some(*day),
        _ => None,
    };
    Some(Date { year, month, day })
}

const NUMBER_WORDS: &[&str] =
    &["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven", "twelve"];

/// The first number in the text ("6,412 metres" is 6412), or a number word up to twelve.
fn parse_number(text: &str) -> Option<f64> {
    let chars: Vec<char> = text.chars().collect();
    let start = chars.iter().position(|c| c.is_ascii_digit());
    if let Some(start) = start {
        let mut digits = String::new();
        let mut i = start;
        while i < chars.len() {
            let c = chars[i];
            let thousands = c == ',' && chars.get(i + 1..i + 4).is_some_and(|d| d.iter().all(char::is_ascii_digit));
            let decimal = c == '.' && chars.get(i + 1).is_some_and(char::is_ascii_digit) && !digits.contains('.');
            if c.is_ascii_digit() || decimal {
                digits.push(c);
            } else if !thousands {
                break;
            }
            i += 1;
        }
        return digits.parse().ok();
    }
    tokens(text).iter().find_map(|t| NUMBER_WORDS.iter().position(|w| w == t)).map(|n| n as f64)
}

/// Which option the values choose: the first or second, None when a value is missing, is not in the
/// Information (its year, or its number, is written nowhere there: the 1.5B model fills in a date it
/// was not shown, at times the prompt example's own, rather than write "unknown"), or they tie.
fn choose(comparison: Comparison, first: &str, second: &str, information: &str) -> Option<bool> {
    use std::cmp::Ordering;
    let order = match comparison.measure {
        Measure::Date => {
            let (a, b) = (parse_date(first)?, parse_date(second)?);
            let written = tokens(information);
            if ![a.year, b.year].iter().all(|year| written.contains(&year.to_string())) {
                return None;
            }
            let mut order = a.year.cmp(&b.year);
            if order == Ordering::Equal
                && let (Some(am), Some(bm)) = (a.month, b.month)
            {
                order = am.cmp(&bm);
                if order == Ordering::Equal
                    && let (Some(ad), Some(bd)) = (a.day, b.day)
                {
                    order = ad.cmp(&bd);
                }
            }
            order
        }
        Measure::Number => {
            let (a, b) = (parse_number(first)?, parse_number(second)?);
            let written: Vec<f64> = information.split_whitespace().filter_map(parse_number).collect();
            if !written.contains(&a) || !written.contains(&b) {
                return None;
            }
            a.partial_cmp(&b)?
        }
    };
    match (order, comparison.wanted) {
        (Ordering::Equal, _) => None,
        (Ordering::Less, Wanted::Least) | (Ordering::Greater, Wanted::Most) => Some(true),
        _ => Some(false),
    }
}

/// The answer names the option: normalised as scoring does, either one's words are a run of the
/// other's ("the Leonberger" names "Leonberger"; "Sordid" names "Sordid Lives").
fn names(answer: &str, option: &str) -> bool {
    let (a, o) = (normalize_answer(answer), normalize_answer(option));
    !a.is_empty() && !o.is_empty() && (contains_words(&a, &o) || contains_words(&o, &a))
}

/// The option a verified fact links an answer naming neither option to ("Steve Carver directed
/// Lone Wolf McQuade": the answer "Steve Carver" means that film). None unless the facts agree.
fn linked_option<'a>(memory: &Memory, answer: &str, options: &'a Options) -> Option<&'a str> {
    let mut linked = None;
    for fact in memory.verified_facts() {
        if !names(&fact.text, answer) {
            continue;
        }
        let option = match (names(&fact.text, &options.first), names(&fact.text, &options.second)) {
            (true, false) => &options.first,
            (false, true) => &options.second,
            _ => continue,
        };
        if linked.is_some_and(|l: &String| l != option) {
            return None;
        }
        linked = Some(option);
    }
    linked.map(String::as_str)
}

#[derive(Deserialize, JsonSchema)]
struct Values {
    explanation: String,
    first: String,
    second: String,
}

fn schema() -> Schema {
    Schema::of::<Values>("compare_options")
}

/// Settles the answer of a question that compares two named options: one call copies each option's
/// date or number from `information` and the comparison decides; when a value is missing, an answer
/// naming neither option takes the option a verified fact links it to. Any other question, two
/// alternatives without a comparative included, is left as the model answered it. Returns the answer and
/// explanation to give, unchanged when nothing settles them. An unusable reply is a degraded step,
/// not a failed question.
pub async fn settle(
    llm: &LlmClient,
    memory: &mut Memory,
    stage: &str,
    information: &str,
    answer: String,
    explanation: String,
) -> Result<(String, String), LlmError> {
    // Only a real comparison: elsewhere "A or B" is as likely a list of names for one thing.
    let Some((options, comparison)) = compared_options(&memory.question).filter(|_| !memory.yes_no) else {
        return Ok((answer, explanation));
    };
    let mut values = Vec::new();
    {
        let prompt = prompts::fill(
            prompts::COMPARE_OPTIONS,
            &[
                ("facts", information),
                ("question", &memory.question),
                ("first", &options.first),
                ("second", &options.second),
            ],
        );
        match llm.structured::<Values>(prompts::SYSTEM, &prompt, &schema()).await {
            Ok(reply) => {
                note_call(memory, stage, "compare_options", &reply.stats);
                let Values { explanation: copied, first, second } = reply.value;
                let chosen = choose(comparison, &first, &second, information);
                values = vec![(options.first.clone(), first.clone()), (options.second.clone(), second.clone())];
                if let Some(is_first) = chosen {
                    let option = if is_first { &options.first } else { &options.second };
                    memory.record(
                        stage,
                        TraceKind::OptionsSettled { values, answer_before: answer.clone(), answer: option.clone() },
                    );
                    let explanation = format!(
                        "{copied} Compared: {} ({first}) and {} ({second}), so {option}.",
                        options.first, options.second
                    );
                    return Ok((option.clone(), explanation));
                }
            }
            Err(error @ LlmError::BadResponse(_)) => {
                degrade(memory, stage, error.error_type(), error.to_string());
            }
            Err(error) => return Err(error),
        }
    }
    let named = names(&answer, &options.first) || names(&answer, &options.second);
    let linked = if named { None } else { linked_option(memory, &answer, &options).map(str::to_string) };
    let settled = linked.unwrap_or_else(|| answer.clone());
    memory.record(stage, TraceKind::OptionsSettled { values, answer_before: answer.clone(), answer: settled.clone() });
    if settled == answer {
        return Ok((answer, explanation));
    }
    let explanation = format!("{explanation} A verified fact links {answer} to {settled}.");
    Ok((settled, explanation))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::topics::{FactSource, KnownFact};

    fn opts(first: &str, second: &str) -> Option<Options> {
        Some(Options { first: first.into(), second: second.into() })
    }

    #[test]
    fn options_are_read_as_the_questions_write_them() {
        // Real dev questions: commas and question marks inside the options.
        assert_eq!(
            options(
                "Which film has the director born earlier, The Adventures Of Priscilla, Queen Of The Desert or Harvest: 3,000 Years?"
            ),
            opts("The Adventures Of Priscilla, Queen Of The Desert", "Harvest: 3,000 Years")
        );
        assert_eq!(
            options("Which film came out earlier, She Shall Have Music or That Devil, Bateese?"),
            opts("She Shall Have Music", "That Devil, Bateese")
        );
        assert_eq!(
            options(
                "Which film has the director who died later, What Will You Do When You Catch Me? or School On Fire?"
            ),
            opts("What Will You Do When You Catch Me?", "School On Fire")
        );
        assert_eq!(
            options("Which music group has the most members, DC Talk, or Manchester Orchestra?"),
            opts("DC Talk", "Manchester Orchestra")
        );
        assert_eq!(
            options("Was Jovita Carranza or Fidel Kuri Grajales born first?"),
            opts("Jovita Carranza", "Fidel Kuri Grajales")
        );
        assert_eq!(options("Is Baiyin or Xinghua, Jiangsu a county-level city?"), opts("Baiyin", "Xinghua"));
        assert_eq!(options("Who directed the film Payment on Demand?"), None);
        assert_eq!(
            options(
                "Who has more national championships than the school with Fort Hill or the facility in the location Edwards won the primary, but not the state with the 404 area code?"
            ),
            None
        );
    }

    /// Question shapes of our own, not from any evaluation set: what must not be taken for a pair
    /// of options to compare.
    #[test]
    fn only_two_named_options_are_a_pair() {
        assert_eq!(options("Which came first, Ravenna, Pavia, or Lucca?"), None, "three alternatives");
        assert_eq!(
            options("The diploma abbreviated BEng, BE, or BAI is awarded in what discipline?"),
            None,
            "abbreviations of one thing"
        );
        assert_eq!(options("Is the title shortened to PhD or DPhil at older universities?"), None);
        assert_eq!(
            options("Which bridge opened first, Harwick Bridge or Dunmore Viaduct?"),
            opts("Harwick Bridge", "Dunmore Viaduct")
        );
        assert_eq!(
            options("Which band has more albums, Glass Lantern, or The Copper Hours?"),
            opts("Glass Lantern", "The Copper Hours")
        );
        assert_eq!(options("Was Ida Morrow or Tom Vale born later?"), opts("Ida Morrow", "Tom Vale"));
    }

    /// Two alternatives without a comparative are not a comparison: the answer is left as the model
    /// gave it, even where a verified fact names one of them beside it.
    #[tokio::test]
    async fn two_alternatives_without_a_comparative_are_left_to_the_model() {
        let mut settings = crate::config::Settings::defaults().llm;
        // Never called: nothing here is a comparison.
        settings.base_url = "http://127.0.0.1:9/v1".into();
        let llm = LlmClient::new(settings);
        for question in
            ["Which is a coastal town, Harwick or Dunmore?", "The port is listed as HWK or DNM in which register?"]
        {
            let mut memory = Memory::new("q", question);
            memory.facts.push(KnownFact {
                text: "Old Pier is the harbour of Harwick, listed as HWK.".into(),
                citations: vec!["p".into()],
                source: FactSource::Verified,
                iteration: 1,
            });
            let (answer, _) = settle(&llm, &mut memory, "main", "", "Old Pier".into(), "read it".into()).await.unwrap();
            assert_eq!(answer, "Old Pier", "{question}");
        }
    }

    #[test]
    fn the_question_says_which_end_it_wants() {
        let date = |wanted| Some(Comparison { wanted, measure: Measure::Date });
        let number = |wanted| Some(Comparison { wanted, measure: Measure::Number });
        let comparison = |question: &str| comparison(question, &options(question).unwrap());
        assert_eq!(comparison("Which film has the director died earlier, Kestrel or Marlow?"), date(Wanted::Least));
        assert_eq!(
            comparison("Which film has the director who is older than the other, Kestrel or Marlow?"),
            date(Wanted::Least)
        );
        assert_eq!(comparison("Which film was released more recently, Kestrel or Marlow?"), date(Wanted::Most));
        assert_eq!(comparison("Who is younger, Kestrel or Marlow?"), date(Wanted::Most));
        assert_eq!(comparison("Which mountain is higher, Kestrel or Marlow?"), number(Wanted::Most));
        assert_eq!(
            comparison("Which genus of flowering plants has the most species, Kestrel or Marlow?"),
            number(Wanted::Most)
        );
        assert_eq!(comparison("Who lived longer, Kestrel or Marlow?"), None, "a lifespan is computed, not copied");
        assert_eq!(comparison("Which is a comedy film, Kestrel or Marlow?"), None);
        assert_eq!(
            comparison("Which film was released more recently, Green Grass Of Wyoming or The Life Of Na Woon-Gyu?"),
            date(Wanted::Most),
            "the options' own words do not count"
        );
        assert_eq!(comparison("Which film came out first, The Last Voyage or Harbour Lights?"), date(Wanted::Least));
    }

    #[test]
    fn dates_and_numbers_are_compared_as_written() {
        let died_earlier = Comparison { wanted: Wanted::Least, measure: Measure::Date };
        // The 2Wiki case the model got wrong: Bernhardt died 22 February 1981, Boese 6 July 1958.
        let facts = "Curtis Bernhardt died on 22 February 1981.; Carl Boese died on 6 July 1958.";
        assert_eq!(choose(died_earlier, "22 February 1981", "6 July 1958", facts), Some(false));
        let same_year = "Lyle Crossley died on March 9, 1979; Ferdl Amsinger died in October 1979.";
        assert_eq!(
            choose(died_earlier, "March 9, 1979", "14 October 1979", same_year),
            Some(true),
            "the month decides"
        );
        assert_eq!(choose(died_earlier, "1979", "14 October 1979", same_year), None, "same year, one month unknown");
        assert_eq!(choose(died_earlier, "unknown", "1958", facts), None);
        assert_eq!(choose(died_earlier, "1901 – 1981", "1958", facts), None, "a range is not one date");
        assert_eq!(
            choose(died_earlier, "14 October 1961", "6 July 1958", facts),
            None,
            "1961 is not in the Information"
        );
        let higher = Comparison { wanted: Wanted::Most, measure: Measure::Number };
        let heights = "Muztagh Ata is 7,509 metres high. Manaslu rises to 8,163 metres (26,781 ft).";
        assert_eq!(choose(higher, "7,509 metres", "8,163 m", heights), Some(false));
        assert_eq!(choose(higher, "7,509 metres", "8,848 m", heights), None, "8,848 is not in the Information");
        assert_eq!(choose(higher, "three members", "2", "The band has three members; the other 2."), Some(true));
        assert_eq!(choose(higher, "many", "2", "many, 2"), None);
        assert_eq!(parse_date("born c. 1380 in Pisa").map(|d| d.year), Some(1380));
        assert_eq!(parse_date("Sept. 3, 1911"), Some(Date { year: 1911, month: Some(9), day: Some(3) }));
        assert_eq!(parse_date("Mart van Duren, 1975").map(|d| d.month), Some(None), "a name is not a month");
    }

    #[test]
    fn an_answer_naming_neither_option_takes_the_one_a_fact_links_it_to() {
        let mut memory = Memory::new("q", "Which film has the director born first, Lone Wolf Mcquade or Sordid Lives?");
        for text in ["Steve Carver directed Lone Wolf McQuade.", "Sordid Lives was directed by Del Shores."] {
            memory.facts.push(KnownFact {
                text: text.into(),
                citations: vec!["p".into()],
                source: FactSource::Verified,
                iteration: 1,
            });
        }
        let options = options(&memory.question).unwrap();
        assert_eq!(linked_option(&memory, "Steve Carver", &options), Some("Lone Wolf Mcquade"));
        assert_eq!(linked_option(&memory, "Bette Davis", &options), None);
        assert!(names("Lone Wolf McQuade", &options.first));
        assert!(names("the Leonberger", "the  Leonberger"));
        assert!(!names("Sordid", "Lone Wolf Mcquade"));
    }
}
