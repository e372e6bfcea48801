//! Evaluation profiles: layers of settings over config/default.toml chosen by dataset, so a published
//! method can be reproduced as it was run on each dataset, while Lacuna's default stays one
//! configuration for every question (a question in production carries no dataset label).
//!
//! A profile is up to three TOML layers, applied in order: `common`, then the dataset's group
//! (`multihop`, `odqa` or `commonsense`, MIGRES Table 11's columns), then the dataset's own (by folder
//! name); without a dataset (`ask`, `run`, `serve`) only `common`. `paper`, `before`, `fast`,
//! `adaptive`, `loop`, `shallow` and `levers` are compiled in (config/profiles/<name>/); `--profile DIR` reads the same
//! file names from a directory, any of them optional. The group of a dataset the papers used comes
//! from its folder name; any other dataset folder names its group in a `profile.toml`
//! (`group = "multihop"`).

use std::path::Path;

use anyhow::{Context, bail};

pub const GROUPS: [&str; 3] = ["multihop", "odqa", "commonsense"];

/// The built-in profiles, each a list of layers by name.
const BUILT_IN: [(&str, &[(&str, &str)]); 7] = [
    ("paper", &PAPER),
    ("before", &BEFORE),
    ("fast", &FAST),
    ("adaptive", &ADAPTIVE),
    ("loop", &LOOP),
    ("shallow", &SHALLOW),
    ("levers", &LEVERS),
];

/// The `before` profile: the default before issue 47's cost levers, kept so it can be rerun.
const BEFORE: [(&str, &str); 1] = [("common", include_str!("profiles/before/common.toml"))];

/// The `fast` profile: the cheapest configuration within 1 EM of the default on the tuning half.
const FAST: [(&str, &str); 1] = [("common", include_str!("profiles/fast/common.toml"))];

/// The `adaptive` profile, the default's method: one read first, the loop only for an answer a check
/// finds unsupported.
const ADAPTIVE: [(&str, &str); 1] = [("common", include_str!("profiles/adaptive/common.toml"))];

/// The `loop` profile: the default before issue 76, the loop from the first iteration on.
const LOOP: [(&str, &str); 1] = [("common", include_str!("profiles/loop/common.toml"))];

/// The `shallow` profile: the default with 30 passages a query, about two thirds of the re-ranker's work.
const SHALLOW: [(&str, &str); 1] = [("common", include_str!("profiles/shallow/common.toml"))];

/// The `levers` profile: the default with every issue-76 lever on and its loop run as `fast` runs it,
/// the candidate for the held-out run.
const LEVERS: [(&str, &str); 1] = [("common", include_str!("profiles/levers/common.toml"))];

/// The `paper` profile's layers by name.
const PAPER: [(&str, &str); 6] = [
    ("common", include_str!("profiles/paper/common.toml")),
    ("multihop", include_str!("profiles/paper/multihop.toml")),
    ("odqa", include_str!("profiles/paper/odqa.toml")),
    ("commonsense", include_str!("profiles/paper/commonsense.toml")),
    ("2wikimultihopqa", include_str!("profiles/paper/2wikimultihopqa.toml")),
    ("musique", include_str!("profiles/paper/musique.toml")),
];

/// The TOML layers of `profile` for the dataset folder `dataset_dir` (none: `common` alone), in
/// the order they apply.
pub fn layers(profile: &str, dataset_dir: Option<&Path>) -> anyhow::Result<Vec<String>> {
    let mut wanted = vec!["common".to_string()];
    if let Some(dir) = dataset_dir {
        let dataset = dir.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        wanted.push(group_of(dir, &dataset)?.to_string());
        wanted.push(dataset);
    }
    if let Some((_, built_in)) = BUILT_IN.iter().find(|(name, _)| *name == profile) {
        let layer = |name: &String| built_in.iter().find(|(n, _)| n == name).map(|(_, text)| text.to_string());
        return Ok(wanted.iter().filter_map(layer).collect());
    }
    let dir = Path::new(profile);
    if !dir.is_dir() {
        bail!(
            "profile {profile}: neither a built-in profile (paper, before, fast, adaptive, loop, shallow, levers) nor a directory of TOML layers"
        );
    }
    let mut out = Vec::new();
    for name in &wanted {
        let file = dir.join(format!("{name}.toml"));
        if file.is_file() {
            out.push(std::fs::read_to_string(&file).with_context(|| format!("cannot read {}", file.display()))?);
        }
    }
    Ok(out)
}

/// Table 11's column for a dataset: from its `profile.toml`, else from the folder name.
fn group_of(dataset_dir: &Path, dataset: &str) -> anyhow::Result<&'static str> {
    let file = dataset_dir.join("profile.toml");
    if file.is_file() {
        let group = ::config::Config::builder()
            .add_source(::config::File::from(file.clone()))
            .build()
            .and_then(|c| c.get_string("group"))
            .with_context(|| {
                format!("{}: expected group = \"multihop\", \"odqa\" or \"commonsense\"", file.display())
            })?;
        return GROUPS
            .into_iter()
            .find(|g| *g == group)
            .with_context(|| format!("{}: unknown group {group:?} (multihop, odqa, commonsense)", file.display()));
    }
    Ok(match dataset {
        "hotpotqa" | "2wikimultihopqa" | "musique" => "multihop",
        "nq" => "odqa",
        "strategyqa" => "commonsense",
        other => bail!(
            "dataset {other}: no group for a profile; add {}/profile.toml with group = \"multihop\", \"odqa\" or \"commonsense\"",
            dataset_dir.display()
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Acceptance, DecisionPrompt, Settings};

    fn with_profile(dataset: &str) -> Settings {
        let layers = layers("paper", Some(Path::new("/data").join(dataset).as_path())).unwrap();
        Settings::load_with(None, &layers).unwrap()
    }

    #[test]
    fn the_paper_profile_follows_table_11_per_dataset_group() {
        let hotpot = with_profile("hotpotqa");
        assert_eq!((hotpot.migres.max_iterations, hotpot.rqrag.max_depth), (5, 2));
        assert_eq!(hotpot.migres.acceptance, Acceptance::Flag, "none of the answer levers");
        assert_eq!(hotpot.migres.decision_prompt, DecisionPrompt::Flag);
        assert!(!hotpot.migres.grounding_gate && !hotpot.llm.reasoning_first);
        assert!(
            !hotpot.migres.limit_reads_verified && hotpot.nli.recite_uncited == 0,
            "the paper's final answer and NLI"
        );
        assert_eq!(with_profile("musique").rqrag.max_depth, 4, "RQ-RAG goes 4 deep on MuSiQue and 2Wiki");
        assert_eq!(with_profile("nq").migres.max_iterations, 3);
        assert!(with_profile("strategyqa").migres.rerank_threshold < 0.0);
    }

    #[test]
    fn an_unknown_dataset_must_name_its_group() {
        let error = layers("paper", Some(Path::new("/data/mine"))).unwrap_err().to_string();
        assert!(error.contains("profile.toml"), "{error}");
        let dir = std::env::temp_dir().join(format!("lacuna-profile-{}", std::process::id())).join("mine");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("profile.toml"), "group = \"odqa\"\n").unwrap();
        let settings = Settings::load_with(None, &layers("paper", Some(&dir)).unwrap()).unwrap();
        assert_eq!(settings.migres.max_iterations, 3);
        std::fs::remove_dir_all(dir.parent().unwrap()).unwrap();
    }

    #[test]
    fn the_before_profile_pins_the_default_of_2026_11_26_without_a_dataset() {
        let before = Settings::load_with(None, &layers("before", None).unwrap()).unwrap();
        let defaults = Settings::defaults();
        assert_eq!(before.nli.calls, crate::config::NliCalls::PerFact);
        assert!(!before.migres.stop_when_not_learning && before.migres.compare_options);
        assert_eq!(before.migres.max_iterations, defaults.migres.max_iterations);
        let error = layers("nonesuch", None).unwrap_err().to_string();
        assert!(error.contains("paper, before, fast"), "{error}");
        let fast = Settings::load_with(None, &layers("fast", None).unwrap()).unwrap();
        assert!(fast.migres.stop_when_not_learning, "fast stops when an iteration learns nothing");
        assert_eq!(fast.nli.unjudged, crate::config::Unjudged::NamesAndNumbers, "and asks the judge less");
    }

    #[test]
    fn the_shallow_profile_is_the_loop_at_30_passages_a_query() {
        let shallow = Settings::load_with(None, &layers("shallow", None).unwrap()).unwrap();
        let mut expected = Settings::load_with(None, &layers("loop", None).unwrap()).unwrap();
        assert_eq!((expected.migres.retrieve_top_n, shallow.migres.retrieve_top_n), (50, 30));
        expected.migres.retrieve_top_n = 30;
        assert_eq!(format!("{shallow:?}"), format!("{expected:?}"), "nothing else moves");
    }

    /// One read first is the default since issue 76; `loop` is the default before it, and `adaptive`
    /// names the default's method.
    #[test]
    fn the_loop_profile_is_the_default_without_its_first_read() {
        let defaults = Settings::defaults();
        let the_loop = Settings::load_with(None, &layers("loop", None).unwrap()).unwrap();
        let adaptive = Settings::load_with(None, &layers("adaptive", None).unwrap()).unwrap();
        assert!(defaults.migres.read_first && !the_loop.migres.read_first);
        let mut expected = defaults.clone();
        expected.migres.read_first = false;
        assert_eq!(format!("{the_loop:?}"), format!("{expected:?}"), "nothing else moves");
        assert_eq!(format!("{adaptive:?}"), format!("{defaults:?}"));
    }

    /// `levers` turns on what the default ships off, and moves nothing else: issue 76's checks and
    /// `ends_with_an_option`, and `fast`'s loop.
    #[test]
    fn the_levers_profile_is_the_default_with_issue_76_levers_and_the_fast_loop() {
        use crate::config::GoOnWhen;
        let levers = Settings::load_with(None, &layers("levers", None).unwrap()).unwrap();
        let fast = Settings::load_with(None, &layers("fast", None).unwrap()).unwrap();
        let mut expected = Settings::defaults();
        expected.migres.read_first_goes_on_when.extend([
            GoOnWhen::YesNoOfTwo,
            GoOnWhen::AsksPlace,
            GoOnWhen::AsksDate,
            GoOnWhen::AsksNumber,
        ]);
        expected.migres.ends_with_an_option = true;
        expected.migres.stop_when_not_learning = fast.migres.stop_when_not_learning;
        expected.migres.knowledge_prompting = fast.migres.knowledge_prompting;
        expected.nli = fast.nli.clone();
        assert_eq!(format!("{levers:?}"), format!("{expected:?}"), "nothing else moves");
    }
}
