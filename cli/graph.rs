//! `lacuna graph`: a pipeline's topology as its declaration gives it. The README's diagrams and the
//! Helm chart's stage lists (`helm/lacuna/pipelines.yaml`) are this command's output, and
//! `lacuna graph --write` puts it there after a declaration changed.

use clap::{Args, ValueEnum};

use crate::pipelines::{PipelineKind, render};

#[derive(Clone, Copy, ValueEnum)]
enum Format {
    /// One line per stage: its inputs and outputs.
    Text,
    /// A Mermaid flowchart (GitHub renders it in Markdown).
    Mermaid,
    /// Graphviz DOT.
    Dot,
    /// Every pipeline's declaration as JSON.
    Json,
    /// Every pipeline's stages, singletons and topics, as helm/lacuna/pipelines.yaml.
    Helm,
}

#[derive(Args)]
pub struct GraphArgs {
    /// One pipeline (text, mermaid, dot); all of them when left out.
    #[arg(long)]
    pipeline: Option<PipelineKind>,
    #[arg(long, value_enum, default_value = "text")]
    format: Format,
    /// Rewrite what the repository at DIR shows of the declarations: helm/lacuna/pipelines.yaml,
    /// the README's MIGRES diagram, and docs/pipelines.md's `lacuna graph` output and diagrams.
    #[arg(long, value_name = "DIR", num_args = 0..=1, default_missing_value = ".")]
    write: Option<std::path::PathBuf>,
}

pub fn graph(args: GraphArgs) -> anyhow::Result<()> {
    if let Some(root) = &args.write {
        return write(root);
    }
    let kinds = match args.pipeline {
        Some(kind) => vec![kind],
        None => PipelineKind::ALL.to_vec(),
    };
    match args.format {
        Format::Json => println!("{}", serde_json::to_string_pretty(&render::json())?),
        Format::Helm => print!("{}", render::helm_values()),
        Format::Text => kinds.iter().for_each(|k| print!("{}", render::text(*k))),
        Format::Mermaid => kinds.iter().for_each(|k| print!("{}", render::mermaid(*k))),
        Format::Dot => kinds.iter().for_each(|k| print!("{}", render::dot(*k))),
    }
    Ok(())
}

/// Rewrites the generated parts of the repository at `root` (see [`GraphArgs::write`]).
fn write(root: &std::path::Path) -> anyhow::Result<()> {
    use anyhow::Context;
    let helm = root.join("helm/lacuna/pipelines.yaml");
    std::fs::write(&helm, render::helm_values()).with_context(|| format!("writing {}", helm.display()))?;
    let mermaid = |kind: PipelineKind| format!("```mermaid\n{}```", render::mermaid(kind));
    let readme = root.join("README.md");
    let text = std::fs::read_to_string(&readme).with_context(|| format!("reading {}", readme.display()))?;
    std::fs::write(&readme, replace_block(&text, "", "```mermaid\n", &mermaid(PipelineKind::Migres))?)?;
    let page = root.join("docs/pipelines.md");
    let mut text = std::fs::read_to_string(&page).with_context(|| format!("reading {}", page.display()))?;
    let all: String = PipelineKind::ALL.iter().map(|k| render::text(*k)).collect();
    text = replace_block(&text, "$ lacuna graph\n", "", &format!("{all}```"))?;
    for kind in PipelineKind::ALL {
        text = replace_block(&text, &format!("### {kind}\n\n"), "```mermaid\n", &mermaid(kind))?;
    }
    std::fs::write(&page, text)?;
    eprintln!("wrote {}, {} and {}", helm.display(), readme.display(), page.display());
    Ok(())
}

/// `text` with the block that starts at `start` right after `anchor` and ends with the next
/// "```" replaced by `block` (which includes its own fences as they should read).
fn replace_block(text: &str, anchor: &str, start: &str, block: &str) -> anyhow::Result<String> {
    let at = text.find(&format!("{anchor}{start}")).map(|i| i + anchor.len());
    let at = at.ok_or_else(|| anyhow::anyhow!("no {anchor:?} followed by {start:?} to replace"))?;
    let fence = text[at + start.len()..].find("```").map(|i| at + start.len() + i + 3);
    let end = fence.ok_or_else(|| anyhow::anyhow!("the block after {anchor:?} never closes"))?;
    Ok(format!("{}{block}{}", &text[..at], &text[end..]))
}
