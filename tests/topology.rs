//! The pipelines' declarations are their graphs: every topic a stage reads has a producer, every
//! topic a stage writes has a consumer (or is a sink), every declared stage has its settings, and
//! the diagrams in the docs are what `lacuna graph` prints today. And the source tree keeps the
//! promises lib.rs and docs/development.md make about it: the layers, no circles, maps that name
//! every file, no file past 600 lines.

use lacuna::config::{Settings, StageSettings};
use lacuna::pipelines::declaration::{Replicas, StageDecl, Startable};
use lacuna::pipelines::{PipelineKind, graph, render};
use lacuna::topics::Topic;

#[test]
fn every_topic_of_every_pipeline_has_both_ends() {
    for kind in PipelineKind::ALL {
        let problems = graph::problems(kind.stages());
        assert!(problems.is_empty(), "{kind}: {problems:#?}");
    }
}

fn never_built(_: &lacuna::pipelines::declaration::StageStart<'_>) -> Result<Startable, lacuna::pipelines::StartError> {
    unreachable!("the topology check builds nothing")
}

const fn decl(name: &'static str, inputs: &'static [Topic], outputs: &'static [Topic]) -> StageDecl {
    StageDecl {
        name,
        inputs,
        outputs,
        needs: &[],
        replicas: Replicas::Scaled,
        runs: StageSettings::LLM,
        prompts: |_| Vec::new(),
        build: never_built,
    }
}

#[test]
fn a_miswired_pipeline_is_reported() {
    let stages = [
        decl("first", &[Topic::Questions], &[Topic::Passages]),
        // Nothing writes facts, and nothing reads what this stage writes to `missing`.
        decl("second", &[Topic::Passages, Topic::Facts], &[Topic::Answers, Topic::Missing]),
        decl("third", &[Topic::Passages], &[Topic::Answers]),
    ];
    let problems = graph::problems(&stages);
    assert!(problems.contains(&"second consumes facts, which nothing produces".to_string()), "{problems:?}");
    assert!(problems.contains(&"second produces missing, which nothing consumes".to_string()), "{problems:?}");
    assert!(problems.contains(&"passages has several consumers: second, third".to_string()), "{problems:?}");
    assert_eq!(problems.len(), 3, "{problems:?}");
}

/// A stage runs on the settings its declaration gives, so adding one needs no TOML; a
/// `[stages.NAME]` section changes only the keys it sets, and one for a stage no pipeline has is a
/// typo, refused.
#[test]
fn a_stage_runs_on_its_declared_settings_unless_a_section_overrides_them() {
    let settings = Settings::defaults();
    settings.check_stage_names(PipelineKind::all_stage_names()).unwrap();
    assert!(settings.stages.is_empty(), "config/default.toml needs no [stages.*] section");
    let leaf = PipelineKind::Migres.stage("leaf").unwrap();
    assert_eq!(leaf.settings(&settings), StageSettings { max_in_flight: 8, llm_concurrency: 2 });
    let filter = PipelineKind::Migres.stage("sentence_filter").unwrap();
    assert_eq!(filter.settings(&settings).max_in_flight, 16, "sentence_filter declares its own");

    let overridden = Settings::load_with(None, &["[stages.leaf]\nllm_concurrency = 6".to_string()]).unwrap();
    assert_eq!(leaf.settings(&overridden), StageSettings { max_in_flight: 8, llm_concurrency: 6 });

    let typo = Settings::load_with(None, &["[stages.leef]\nmax_in_flight = 4".to_string()]).unwrap();
    let error = typo.check_stage_names(PipelineKind::all_stage_names()).unwrap_err();
    assert!(error.contains("[stages.leef]: no pipeline has a stage"), "{error}");
}

#[test]
fn unknown_stage_names_are_refused_with_the_list() {
    let error = PipelineKind::Vanilla.stage("leaf").err().expect("vanilla has no leaf").to_string();
    assert_eq!(error, "vanilla has no stage \"leaf\"; its stages are retrieve, sentence_filter, reader");
}

#[test]
fn the_documented_diagrams_are_what_lacuna_graph_prints() {
    let root = env!("CARGO_MANIFEST_DIR");
    let docs = std::fs::read_to_string(format!("{root}/docs/pipelines.md")).unwrap();
    for kind in PipelineKind::ALL {
        let diagram = format!("```mermaid\n{}```", render::mermaid(kind));
        assert!(
            docs.contains(&diagram),
            "docs/pipelines.md lacks the current graph of {kind}: paste `lacuna graph --pipeline {kind} --format mermaid`"
        );
    }
}

#[test]
fn the_readme_and_the_pipelines_page_show_what_lacuna_graph_prints() {
    let root = env!("CARGO_MANIFEST_DIR");
    let docs = std::fs::read_to_string(format!("{root}/docs/pipelines.md")).unwrap();
    let all: String = PipelineKind::ALL.iter().map(|k| render::text(*k)).collect();
    assert!(docs.contains(&format!("$ lacuna graph\n{all}```")), "docs/pipelines.md's `lacuna graph` output is stale");
    let readme = std::fs::read_to_string(format!("{root}/README.md")).unwrap();
    let migres = format!("```mermaid\n{}```", render::mermaid(PipelineKind::Migres));
    assert!(readme.contains(&migres), "the README's MIGRES diagram is stale");
}

/// Provenance hashes the prompts the stages declare (`Stage::prompts`), so a template no stage
/// declares could change without changing any answer's provenance: every file of actors/prompts/ is
/// declared by some stage of some pipeline, under the defaults or the setting that turns it on.
#[test]
fn every_prompt_template_is_declared_by_a_stage() {
    let variants = [
        "",
        "[migres]\ndecision_prompt = \"attempt\"",
        "[migres]\nqueries_from_main = true",
        "[nli]\nentailment_prompt = \"strict\"\ncalls = \"per_leaf\"",
    ];
    let mut declared = std::collections::BTreeMap::new();
    for variant in variants {
        let settings = Settings::load_with(None, &[variant.to_string()]).unwrap();
        for kind in PipelineKind::ALL {
            for stage in kind.stages() {
                for (name, text) in (stage.prompts)(&settings) {
                    declared.insert(name, text);
                }
            }
        }
    }
    let folder = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("actors/prompts");
    for file in std::fs::read_dir(&folder).unwrap().map(|e| e.unwrap().path()) {
        if file.extension().is_none_or(|e| e != "txt") {
            continue;
        }
        let name = file.file_stem().unwrap().to_str().unwrap();
        let text = declared.get(name).unwrap_or_else(|| panic!("no stage declares the prompt {name}.txt"));
        assert_eq!(*text, std::fs::read_to_string(&file).unwrap(), "{name} is declared with another text");
    }
}

#[test]
fn a_pipeline_creates_only_the_topics_it_uses() {
    let names = |kind: PipelineKind| graph::topics(kind.stages()).iter().map(|t| t.name()).collect::<Vec<_>>();
    assert_eq!(
        names(PipelineKind::Vanilla),
        ["questions", "passages", "evidence", "answers", "dead_letters", "progress"]
    );
    assert!(names(PipelineKind::Raisf).contains(&"join_state"));
    assert!(!names(PipelineKind::Migres).contains(&"joins"));
}

/// The layers, lowest first: each uses only those below it. `metrics` (the metric names) uses none.
const LAYERS: [&str; 10] =
    ["metrics", "config", "telemetry", "topics", "actors", "pipelines", "eval", "bench", "serve", "cli"];

/// Each layer uses only those below it: config < telemetry < topics < actors < pipelines < eval < bench < serve
/// < cli, with `metrics` under them all.
#[test]
fn each_layer_imports_only_the_layers_below_it() {
    let tree = layout::Tree::read(root());
    let mut offences = Vec::new();
    for (file, target) in tree.imports() {
        let (from, to) = (layer(&file.module), layer(&target));
        if to > from {
            offences.push(format!("{} uses {} (a layer above it)", file.path, target.join("::")));
        }
    }
    offences.dedup();
    assert!(offences.is_empty(), "{offences:#?}");
}

/// Inside a folder, the files' imports form no circle: a folder reads bottom to top, and any one of
/// its files can be understood from those below it. A `mod.rs` that only declares and re-exports its
/// files is a door, not an import.
#[test]
fn no_files_of_a_folder_import_each_other_in_a_circle() {
    let circles = layout::Tree::read(root()).circles();
    assert!(circles.is_empty(), "{circles:#?}");
}

/// A folder's map (the `//!` comment of its `mod.rs`, or of `lib.rs`) names each of its files and
/// folders in backquotes, so a newcomer can trust it.
#[test]
fn every_folder_map_names_each_of_its_files() {
    let tree = layout::Tree::read(root());
    let mut missing = Vec::new();
    for (map, children) in tree.maps() {
        let source = std::fs::read_to_string(root().join(&map)).unwrap();
        let header: String = source.lines().take_while(|l| l.starts_with("//!")).collect::<Vec<_>>().join("\n");
        for child in children {
            let named = [format!("`{child}`"), format!("`{child}.rs`"), format!("`{child}/`")];
            if !named.iter().any(|n| header.contains(n)) {
                missing.push(format!("{map} does not name `{child}`"));
            }
        }
    }
    assert!(missing.is_empty(), "{missing:#?}");
}

#[test]
fn no_file_outside_tests_passes_600_lines() {
    let tree = layout::Tree::read(root());
    let long: Vec<String> = tree
        .files
        .iter()
        .map(|f| (f.path.clone(), f.source.lines().count()))
        .filter(|(_, lines)| *lines > 600)
        .map(|(path, lines)| format!("{path}: {lines} lines"))
        .collect();
    assert!(long.is_empty(), "split these: {long:#?}");
}

/// docs/development.md's tree has a row for each folder of code, and the row names each of its files.
#[test]
fn the_development_tree_names_every_file() {
    let docs = std::fs::read_to_string(root().join("docs/development.md")).unwrap();
    let start = docs.find("## Layout").expect("docs/development.md has a Layout section");
    let block = docs[start..].split("```").nth(1).expect("the layout is a code block");
    // A row starts at the left margin with the folder's path; its continuation lines are indented.
    let mut rows: Vec<(String, String)> = Vec::new();
    for line in block.lines() {
        match line.strip_prefix(' ') {
            Some(more) => rows.last_mut().map(|(_, text)| text.push_str(more)).unwrap_or(()),
            None => {
                let (folder, text) = line.split_once(' ').unwrap_or((line, ""));
                rows.push((folder.to_string(), text.to_string()));
            }
        }
    }
    let tree = layout::Tree::read(root());
    let mut missing = Vec::new();
    for (map, children) in tree.maps() {
        let Some(folder) = map.strip_suffix("mod.rs") else { continue };
        let Some((_, text)) = rows.iter().find(|(f, _)| f == folder) else {
            missing.push(format!("no row for {folder}"));
            continue;
        };
        let words: Vec<&str> = text.split(|c: char| !(c.is_alphanumeric() || c == '_')).collect();
        for child in children.iter().filter(|c| !words.contains(&c.as_str())) {
            missing.push(format!("the row of {folder} does not name {child}"));
        }
    }
    assert!(missing.is_empty(), "{missing:#?}");
}

fn root() -> &'static std::path::Path {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn layer(module: &[String]) -> usize {
    LAYERS.iter().position(|l| *l == module[0]).unwrap_or_else(|| panic!("{} is in no layer", module.join("::")))
}

/// The library's source read as text: its files, their module paths, and the paths each one names
/// (`crate::`, `super::`, `self::`, and a `mod.rs`'s own children), resolved to the file that holds
/// what they name. Enough of Rust's syntax for this crate; the tests above are its checks.
mod layout {
    use std::collections::{BTreeMap, BTreeSet};
    use std::path::Path;

    pub struct File {
        /// Relative to the crate root, with `/`.
        pub path: String,
        pub module: Vec<String>,
        pub source: String,
        is_mod: bool,
    }

    struct Reference {
        path: Vec<String>,
        /// A `pub use` in a `mod.rs`: a door to a child, not an import.
        reexport: bool,
    }

    pub struct Tree {
        pub files: Vec<File>,
        references: Vec<Vec<Reference>>,
        by_module: BTreeMap<Vec<String>, usize>,
        /// (module, name) -> the module a `mod.rs` re-exports `name` from.
        reexports: BTreeMap<(Vec<String>, String), Vec<String>>,
    }

    impl Tree {
        pub fn read(root: &Path) -> Tree {
            let mut files = Vec::new();
            for layer in super::LAYERS {
                let mut pending = vec![root.join(layer), root.join(format!("{layer}.rs"))];
                while let Some(path) = pending.pop() {
                    if path.is_dir() {
                        pending.extend(std::fs::read_dir(&path).unwrap().map(|e| e.unwrap().path()));
                    } else if path.is_file() && path.extension().is_some_and(|e| e == "rs") {
                        let relative = path.strip_prefix(root).unwrap().to_string_lossy().replace('\\', "/");
                        files.push(File::new(relative, std::fs::read_to_string(&path).unwrap()));
                    }
                }
            }
            files.sort_by(|a, b| a.path.cmp(&b.path));
            let by_module = files.iter().enumerate().map(|(i, f)| (f.module.clone(), i)).collect();
            let mut tree = Tree { files, references: Vec::new(), by_module, reexports: BTreeMap::new() };
            tree.references = tree.files.iter().map(|f| tree.references_of(f)).collect();
            for (file, references) in tree.files.iter().zip(&tree.references) {
                for reference in references.iter().filter(|r| r.reexport) {
                    if let Some((target, rest)) = tree.module_of(&reference.path)
                        && let Some(name) = rest.first()
                    {
                        tree.reexports.insert((file.module.clone(), name.clone()), target);
                    }
                }
            }
            tree
        }

        /// Every (file, module it uses), re-exports followed to where the item lives.
        pub fn imports(&self) -> Vec<(&File, Vec<String>)> {
            let mut out = Vec::new();
            for (file, references) in self.files.iter().zip(&self.references) {
                for reference in references {
                    if let Some(target) = self.resolve(&reference.path)
                        && target != file.module
                        && !(reference.reexport && file.is_mod)
                    {
                        out.push((file, target));
                    }
                }
            }
            out
        }

        /// The circles among the files of each folder, each as the sorted names of its files.
        pub fn circles(&self) -> Vec<String> {
            let mut edges: BTreeMap<Vec<String>, BTreeMap<String, BTreeSet<String>>> = BTreeMap::new();
            for (file, target) in self.imports() {
                let (folder, node) = file.folder_and_node();
                if target.len() < folder.len() || target[..folder.len()] != folder[..] {
                    continue;
                }
                let to = target.get(folder.len()).cloned().unwrap_or_else(|| "mod".into());
                if to != node {
                    edges.entry(folder).or_default().entry(node).or_default().insert(to);
                }
            }
            let mut circles = Vec::new();
            for (folder, graph) in edges {
                for component in strongly_connected(&graph) {
                    circles.push(format!("{}/: {}", folder.join("/"), component.join(", ")));
                }
            }
            circles
        }

        /// Each folder's map (`lib.rs` for the root, else its `mod.rs`) and the names of its files and
        /// folders.
        pub fn maps(&self) -> Vec<(String, Vec<String>)> {
            let mut maps: BTreeMap<String, Vec<String>> = BTreeMap::new();
            for file in &self.files {
                let parent = &file.module[..file.module.len() - 1];
                let map = if parent.is_empty() { "lib.rs".to_string() } else { format!("{}/mod.rs", parent.join("/")) };
                maps.entry(map).or_default().push(file.module.last().unwrap().clone());
            }
            maps.into_iter().collect()
        }

        fn references_of(&self, file: &File) -> Vec<Reference> {
            let code = code_of(&file.source);
            let children: BTreeSet<String> = self
                .by_module
                .keys()
                .filter(|m| file.is_mod && m.len() == file.module.len() + 1 && m.starts_with(&file.module))
                .map(|m| m.last().unwrap().clone())
                .collect();
            let mut raw: Vec<(String, bool)> = Vec::new();
            let mut rest = String::new();
            let mut cursor = 0;
            while let Some(at) = find_word(&code, "use", cursor) {
                let Some(end) = code[at..].find(';').map(|e| at + e) else { break };
                let before = code[..at].trim_end();
                let reexport = before.ends_with("pub") || (before.ends_with(')') && before.contains("pub("));
                for path in flatten(&code[at + 3..end]) {
                    raw.push((path, reexport));
                }
                rest.push_str(&code[cursor..at]);
                cursor = end + 1;
            }
            rest.push_str(&code[cursor..]);
            for start in path_starts(&rest, &children) {
                let path: String =
                    rest[start..].chars().take_while(|c| c.is_alphanumeric() || *c == '_' || *c == ':').collect();
                raw.push((path, false));
            }
            raw.into_iter()
                .filter_map(|(path, reexport)| {
                    let segments: Vec<String> =
                        path.split("::").map(str::trim).filter(|s| !s.is_empty()).map(String::from).collect();
                    self.absolute(file, &segments, &children).map(|path| Reference { path, reexport })
                })
                .collect()
        }

        /// `segments` as a path from the crate root, if it is one of ours.
        fn absolute(&self, file: &File, segments: &[String], children: &BTreeSet<String>) -> Option<Vec<String>> {
            let first = segments.first()?;
            // `super` of a file is its folder's module; of a mod.rs, the folder's parent.
            let here: Vec<String> =
                if file.is_mod { file.module.clone() } else { file.module[..file.module.len() - 1].to_vec() };
            match first.as_str() {
                "crate" => Some(segments[1..].to_vec()),
                "super" => {
                    let ups = segments.iter().take_while(|s| *s == "super").count();
                    let base = if file.is_mod {
                        &file.module[..file.module.len() - ups]
                    } else {
                        &here[..here.len() + 1 - ups]
                    };
                    Some(base.iter().chain(&segments[ups..]).cloned().collect())
                }
                "self" if file.is_mod => Some(here.iter().chain(&segments[1..]).cloned().collect()),
                name if children.contains(name) => Some(here.iter().chain(segments).cloned().collect()),
                _ => None,
            }
        }

        /// The longest prefix of `path` that is one of our files' modules, and what follows it.
        fn module_of(&self, path: &[String]) -> Option<(Vec<String>, Vec<String>)> {
            (1..=path.len())
                .rev()
                .find(|n| self.by_module.contains_key(&path[..*n]))
                .map(|n| (path[..n].to_vec(), path[n..].to_vec()))
        }

        /// The module whose file holds what `path` names, following re-exports.
        fn resolve(&self, path: &[String]) -> Option<Vec<String>> {
            let (mut module, rest) = self.module_of(path)?;
            for _ in 0..8 {
                match rest.first().and_then(|name| self.reexports.get(&(module.clone(), name.clone()))) {
                    Some(target) if *target != module => module = target.clone(),
                    _ => break,
                }
            }
            Some(module)
        }
    }

    impl File {
        fn new(path: String, source: String) -> File {
            let mut module: Vec<String> = path.trim_end_matches(".rs").split('/').map(String::from).collect();
            let is_mod = module.last().is_some_and(|m| m == "mod");
            if is_mod {
                module.pop();
            }
            File { path, module, source, is_mod }
        }

        /// The folder this file sits in, and its name there (`mod` for the folder's own mod.rs).
        fn folder_and_node(&self) -> (Vec<String>, String) {
            if self.is_mod {
                (self.module.clone(), "mod".into())
            } else {
                (self.module[..self.module.len() - 1].to_vec(), self.module.last().unwrap().clone())
            }
        }
    }

    /// The source without its comments, its string literals' contents and its unit tests (they sit at
    /// the end of a file, behind `#[cfg(test)]`).
    fn code_of(source: &str) -> String {
        let source = source.find("#[cfg(test)]").map_or(source, |at| &source[..at]);
        let chars: Vec<char> = source.chars().collect();
        let mut out = String::with_capacity(source.len());
        let mut i = 0;
        while i < chars.len() {
            let next = chars.get(i + 1).copied();
            match chars[i] {
                '/' if next == Some('/') => {
                    while i < chars.len() && chars[i] != '\n' {
                        i += 1;
                    }
                }
                '/' if next == Some('*') => {
                    while i + 1 < chars.len() && !(chars[i] == '*' && chars[i + 1] == '/') {
                        i += 1;
                    }
                    i += 2;
                }
                '\'' if chars.get(i + 2) == Some(&'\'') || (next == Some('\\') && chars.get(i + 3) == Some(&'\'')) => {
                    // A char literal such as '"' or '\"'.
                    i += if next == Some('\\') { 4 } else { 3 };
                    out.push_str("' '");
                }
                'r' if (next == Some('"') || next == Some('#')) && (i == 0 || !is_ident(chars[i - 1])) => {
                    let hashes = chars[i + 1..].iter().take_while(|c| **c == '#').count();
                    if chars.get(i + 1 + hashes) != Some(&'"') {
                        out.push('r');
                        i += 1;
                        continue;
                    }
                    let closing: String = std::iter::once('"').chain(std::iter::repeat_n('#', hashes)).collect();
                    let body: String = chars[i + 2 + hashes..].iter().collect();
                    let length = body.find(&closing).map_or(body.len(), |at| at + closing.len());
                    i += 2 + hashes + body[..length].chars().count();
                    out.push_str("\"\"");
                }
                '"' => {
                    i += 1;
                    while i < chars.len() && chars[i] != '"' {
                        i += if chars[i] == '\\' { 2 } else { 1 };
                    }
                    i += 1;
                    out.push_str("\"\"");
                }
                c => {
                    out.push(c);
                    i += 1;
                }
            }
        }
        out
    }

    fn is_ident(c: char) -> bool {
        c.is_alphanumeric() || c == '_'
    }

    /// Where `word` starts at or after `from`, standing alone.
    fn find_word(code: &str, word: &str, from: usize) -> Option<usize> {
        let mut at = from;
        while let Some(found) = code[at..].find(word).map(|f| at + f) {
            let before = code[..found].chars().next_back();
            let after = code[found + word.len()..].chars().next();
            if before.is_none_or(|c| !is_ident(c) && c != ':') && after.is_some_and(char::is_whitespace) {
                return Some(found);
            }
            at = found + word.len();
        }
        None
    }

    /// Where paths start that name our modules: `crate::`, `super::`, `self::`, or a child's name.
    fn path_starts(code: &str, children: &BTreeSet<String>) -> Vec<usize> {
        let mut starts = Vec::new();
        for (at, _) in code.match_indices("::") {
            let head: String =
                code[..at].chars().rev().take_while(|c| is_ident(*c)).collect::<Vec<_>>().into_iter().rev().collect();
            let start = at - head.len();
            let before = code[..start].chars().next_back();
            if head.is_empty() || before.is_some_and(|c| c == ':' || is_ident(c)) {
                continue;
            }
            if ["crate", "super", "self"].contains(&head.as_str()) || children.contains(&head) {
                starts.push(start);
            }
        }
        starts
    }

    /// The paths of one `use` tree: `a::{b, c::{d, e as f}}` gives a::b, a::c::d, a::c::e.
    fn flatten(tree: &str) -> Vec<String> {
        let tree: String = tree.split_whitespace().collect::<Vec<_>>().join(" ");
        let tree = tree.trim();
        let Some(open) = tree.find('{') else {
            return vec![tree.split(" as ").next().unwrap().trim().to_string()];
        };
        let prefix = tree[..open].trim_end_matches("::").trim();
        let inner = &tree[open + 1..tree.rfind('}').unwrap_or(tree.len())];
        let (mut items, mut depth, mut current) = (Vec::new(), 0, String::new());
        for c in inner.chars() {
            match c {
                '{' => depth += 1,
                '}' => depth -= 1,
                ',' if depth == 0 => {
                    items.push(std::mem::take(&mut current));
                    continue;
                }
                _ => {}
            }
            current.push(c);
        }
        items.push(current);
        items
            .iter()
            .filter(|i| !i.trim().is_empty())
            .flat_map(|i| flatten(i))
            .map(|p| {
                if prefix.is_empty() {
                    p
                } else if p == "self" {
                    prefix.to_string()
                } else {
                    format!("{prefix}::{p}")
                }
            })
            .collect()
    }

    /// Tarjan's strongly connected components of more than one node, each sorted.
    fn strongly_connected(graph: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
        struct State<'a> {
            graph: &'a BTreeMap<String, BTreeSet<String>>,
            index: BTreeMap<&'a str, usize>,
            low: BTreeMap<&'a str, usize>,
            stack: Vec<&'a str>,
            found: Vec<Vec<String>>,
        }
        fn visit<'a>(s: &mut State<'a>, v: &'a str) {
            let n = s.index.len();
            s.index.insert(v, n);
            s.low.insert(v, n);
            s.stack.push(v);
            for w in s.graph.get(v).into_iter().flatten() {
                if !s.index.contains_key(w.as_str()) {
                    visit(s, w);
                    let low = s.low[v].min(s.low[w.as_str()]);
                    s.low.insert(v, low);
                } else if s.stack.contains(&w.as_str()) {
                    let low = s.low[v].min(s.index[w.as_str()]);
                    s.low.insert(v, low);
                }
            }
            if s.low[v] == s.index[v] {
                let at = s.stack.iter().rposition(|x| *x == v).unwrap();
                let mut component: Vec<String> = s.stack.split_off(at).into_iter().map(String::from).collect();
                if component.len() > 1 {
                    component.sort();
                    s.found.push(component);
                }
            }
        }
        let mut state =
            State { graph, index: BTreeMap::new(), low: BTreeMap::new(), stack: Vec::new(), found: Vec::new() };
        let nodes: BTreeSet<&str> =
            graph.iter().flat_map(|(k, vs)| std::iter::once(k.as_str()).chain(vs.iter().map(String::as_str))).collect();
        for node in nodes {
            if !state.index.contains_key(node) {
                visit(&mut state, node);
            }
        }
        state.found
    }
}
