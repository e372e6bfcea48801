//! Which build made each run, and whether two runs' builds answer alike. A paired difference between
//! runs of two builds is partly the builds': `--compare` warns when the runs it pairs were made with
//! other texts of the same prompt, or by builds whose golden replays differ (tests/golden_replay.rs
//! pins what the default and the profiles answer on a fixed set of questions; a commit that changes
//! what they answer records them again, so two builds with the same golden records answer alike).

use std::collections::BTreeMap;
use std::path::Path;

use sha2::{Digest, Sha256};

use super::resume::RunIdentity;
use crate::topics::provenance::hex;

/// The golden records this build was checked against, hashed.
pub fn golden_sha256() -> String {
    let mut hash = Sha256::new();
    for records in [
        include_str!("../tests/golden/replay/default.jsonl"),
        include_str!("../tests/golden/replay/fast.jsonl"),
        include_str!("../tests/golden/replay/paper.jsonl"),
    ] {
        hash.update(records.as_bytes());
    }
    hex(&hash.finalize())
}

/// What a run's run.json says of the build that made it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Build {
    /// The run's name in the comparison.
    pub run: String,
    pub commit: Option<String>,
    /// Prompt template name -> sha256 of its text.
    pub prompts: BTreeMap<String, String>,
    pub golden: Option<String>,
    /// The CPU its re-ranker scored on (`host::cpu`), where run.json says.
    pub cpu: Option<String>,
}

impl Build {
    /// The build of the run whose report is `report` (its run.json beside it); `None` for runs made
    /// before run.json recorded provenance.
    pub fn of(run: &str, report: &Path) -> Option<Build> {
        let text = std::fs::read_to_string(report.with_file_name("run.json")).ok()?;
        let identity: RunIdentity = serde_json::from_str(&text).ok()?;
        let provenance = identity.provenance?;
        Some(Build {
            run: run.to_string(),
            commit: Some(provenance.commit).filter(|c| !c.is_empty() && c != "unknown"),
            prompts: provenance.prompts_sha256,
            golden: identity.golden_sha256,
            cpu: identity.cpu,
        })
    }
}

/// One line per pair of runs whose builds answer differently: a prompt both use with other texts,
/// or other golden records; and one per pair scored on CPUs with other int8 kernels. Empty when every
/// pair was made alike (or cannot tell).
pub fn differences(builds: &[Build]) -> Vec<String> {
    let mut lines = Vec::new();
    for (i, a) in builds.iter().enumerate() {
        for b in &builds[i + 1..] {
            if let (Some(x), Some(y)) = (kernels(a), kernels(b))
                && x != y
            {
                lines.push(format!(
                    "{} and {} were scored on CPUs with other int8 kernels ({x}; {y}): unless one score cache \
                     served both, part of their difference is the hosts'",
                    a.run, b.run
                ));
            }
            let mut why: Vec<String> = a
                .prompts
                .iter()
                .filter(|(name, hash)| b.prompts.get(*name).is_some_and(|other| other != *hash))
                .map(|(name, _)| format!("prompt {name} differs"))
                .collect();
            if let (Some(x), Some(y)) = (&a.golden, &b.golden)
                && x != y
            {
                why.push("their golden replays differ".into());
            }
            if !why.is_empty() {
                let commit =
                    |build: &Build| build.commit.as_deref().map_or("?".to_string(), |c| c.chars().take(9).collect());
                lines.push(format!(
                    "{} ({}) and {} ({}) come from builds that answer differently: {}; part of their difference is the build's",
                    a.run,
                    commit(a),
                    b.run,
                    commit(b),
                    why.join(", ")
                ));
            }
        }
    }
    lines
}

/// The instruction sets its int8 graph scored with, where run.json names its CPU.
fn kernels(build: &Build) -> Option<&str> {
    super::host::kernels(build.cpu.as_deref()?)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn build(run: &str, prompts: &[(&str, &str)], golden: Option<&str>) -> Build {
        Build {
            run: run.into(),
            commit: Some("0123456789abcdef".into()),
            prompts: prompts.iter().map(|(n, h)| (n.to_string(), h.to_string())).collect(),
            golden: golden.map(String::from),
            cpu: Some("AMD EPYC (avx2)".into()),
        }
    }

    #[test]
    fn runs_of_builds_with_other_prompt_texts_or_golden_records_are_named() {
        let default = build("migres", &[("main", "aa"), ("reader", "bb")], Some("g1"));
        let vanilla = build("vanilla-s", &[("reader", "bb")], Some("g1"));
        assert!(differences(&[default.clone(), vanilla.clone()]).is_empty(), "other prompts are other pipelines");
        let edited = build("migres-new", &[("main", "cc"), ("reader", "bb")], Some("g1"));
        let lines = differences(&[default.clone(), edited]);
        assert_eq!(lines.len(), 1);
        assert!(lines[0].contains("prompt main differs") && lines[0].contains("(012345678)"), "{}", lines[0]);
        let regolded = build("vanilla-s-new", &[("reader", "bb")], Some("g2"));
        let lines = differences(&[default.clone(), regolded]);
        assert!(lines[0].contains("golden replays differ"), "{lines:?}");
    }

    #[test]
    fn runs_scored_on_cpus_with_other_int8_kernels_are_named_whatever_the_model_name() {
        let here = build("migres", &[("main", "aa")], Some("g1"));
        let same_kernels = Build { run: "again".into(), cpu: Some("AMD EPYC 7B13 (avx2)".into()), ..here.clone() };
        assert!(differences(&[here.clone(), same_kernels]).is_empty());
        let vnni =
            Build { run: "vnni".into(), cpu: Some("Intel Xeon (avx2 avx512f avx512_vnni)".into()), ..here.clone() };
        let lines = differences(&[here.clone(), vnni]);
        assert_eq!(lines.len(), 1, "{lines:?}");
        assert!(
            lines[0].starts_with("migres and vnni were scored on CPUs with other int8 kernels (avx2; avx2 avx512f")
        );
        let unknown = Build { run: "old".into(), cpu: None, ..here.clone() };
        assert!(differences(&[here, unknown]).is_empty(), "a run from before run.json named its CPU cannot tell");
    }
}
