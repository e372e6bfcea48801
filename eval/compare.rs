//! `lacuna eval --compare`: several reports side by side, as a Markdown table (pipelines x datasets)
//! and an SVG plot of accuracy against LLM calls per question: what each pipeline's accuracy costs.
//! When the runs' records.jsonl are at hand, comparison.md also gets the paired sections of
//! [`super::paired`]: per-question wins and losses with bootstrap intervals, and where gold passages
//! got lost.

use std::fmt::Write;

use super::paired::{Comparison, ordered};
use super::report::Report;

/// The accuracy the comparison plots: Acc† when every report has it, else lenient EM.
pub fn accuracy_metric(reports: &[Report]) -> (&'static str, fn(&Report) -> f64) {
    if all_judged(reports) { ("Acc†", |r| r.acc_judged.unwrap_or(0.0)) } else { ("lenient EM", |r| r.lenient_em) }
}

/// Every run was scored by the judge (`--judge`), so Acc† can stand beside the others.
fn all_judged(reports: &[Report]) -> bool {
    !reports.is_empty() && reports.iter().all(|r| r.acc_judged.is_some())
}

/// Rows are pipelines, columns datasets; each cell is "EM / lenient EM / cover EM (LLM calls)",
/// and Acc† after them when every run was judged.
pub fn markdown_table(reports: &[Report]) -> String {
    let judged = all_judged(reports);
    let pipelines = ordered(reports.iter().map(|r| r.pipeline.as_str()));
    let datasets = ordered(reports.iter().map(|r| r.dataset.as_str()));
    let mut out = String::new();
    let _ = writeln!(out, "| pipeline | {} |", datasets.join(" | "));
    let _ = writeln!(out, "|---|{}", "---|".repeat(datasets.len()));
    for pipeline in &pipelines {
        let cells: Vec<String> = datasets
            .iter()
            .map(|dataset| match reports.iter().find(|r| r.pipeline == *pipeline && r.dataset == *dataset) {
                Some(r) => format!(
                    "{:.1} / {:.1} / {:.1}{} ({:.1}, n={}){}",
                    100.0 * r.em,
                    100.0 * r.lenient_em,
                    100.0 * r.cover_em,
                    r.acc_judged.filter(|_| judged).map(|a| format!(" / {:.1}", 100.0 * a)).unwrap_or_default(),
                    r.llm_calls,
                    r.questions,
                    r.upper_bound_lenient_em.map(|u| format!(" ≤ {:.1}", 100.0 * u)).unwrap_or_default()
                ),
                None => "-".to_string(),
            })
            .collect();
        let _ = writeln!(out, "| {pipeline} | {} |", cells.join(" | "));
    }
    let _ = writeln!(
        out,
        "\nEach cell: EM / lenient EM / cover EM{} in %, (LLM calls per question, questions scored); \
         ≤ u: lenient EM had the best candidate been chosen (RQ-RAG's upper bound, any trajectory right).",
        if judged { " / Acc†" } else { "" }
    );
    out
}

/// comparison.md: the means table, then the paired sections when there is a paired comparison.
pub fn comparison_markdown(reports: &[Report], paired: Option<&Comparison>) -> String {
    let mut out = String::new();
    if let Some(half) = reports.first().and_then(|r| r.half)
        && reports.iter().all(|r| r.half == Some(half))
    {
        let _ = writeln!(out, "On the {} half of each dataset only (docs/evaluation.md).\n", half.name());
    }
    out.push_str(&markdown_table(reports));
    if let Some(paired) = paired {
        out.push_str(&paired.markdown());
    }
    out
}

const COLORS: [&str; 8] = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf"];

/// What a plot's x axis reads: the cost of a question.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Cost {
    /// LLM calls per question.
    Calls,
    /// Prompt and completion tokens per question.
    Tokens,
}

impl Cost {
    fn of(self, r: &Report) -> f64 {
        match self {
            Cost::Calls => r.llm_calls,
            Cost::Tokens => r.prompt_tokens + r.completion_tokens,
        }
    }

    fn label(self) -> &'static str {
        match self {
            Cost::Calls => "LLM calls per question",
            Cost::Tokens => "prompt + completion tokens per question",
        }
    }
}

/// Accuracy (y, %) against `cost` per question (x): one dot per report, a colour per pipeline,
/// labelled with its dataset.
pub fn svg_plot(reports: &[Report], cost: Cost) -> String {
    let (metric, accuracy) = accuracy_metric(reports);
    let (width, height, left, right, top, bottom) = (720.0, 440.0, 60.0, 170.0, 30.0, 50.0);
    let plot_w = width - left - right;
    let plot_h = height - top - bottom;
    let max_cost = reports.iter().map(|r| cost.of(r)).fold(1.0_f64, f64::max);
    let x_max = (max_cost * 1.15).ceil();
    let max_acc = reports.iter().map(accuracy).fold(0.0_f64, f64::max);
    let y_max = ((max_acc * 100.0 / 10.0).ceil() * 10.0).clamp(10.0, 100.0);
    let x = |value: f64| left + plot_w * value / x_max;
    let y = |acc: f64| top + plot_h * (1.0 - acc * 100.0 / y_max);

    let mut svg = String::new();
    let _ = writeln!(
        svg,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(svg, r#"<rect width="100%" height="100%" fill="white"/>"#);
    // Axes with five ticks each.
    let _ =
        writeln!(svg, r#"<path d="M{left} {top} V{} H{}" stroke="black" fill="none"/>"#, top + plot_h, left + plot_w);
    for i in 0..=5 {
        let tick = x_max * f64::from(i) / 5.0;
        let acc = y_max * f64::from(i) / 5.0;
        let _ = writeln!(
            svg,
            r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">{}</text>"#,
            x(tick),
            top + plot_h + 18.0,
            if cost == Cost::Calls { format!("{tick:.1}") } else { format!("{tick:.0}") },
        );
        let _ = writeln!(
            svg,
            r##"<text x="{:.1}" y="{:.1}" text-anchor="end">{acc:.0}</text><line x1="{left}" x2="{:.1}" y1="{:.1}" y2="{:.1}" stroke="#ddd"/>"##,
            left - 6.0,
            y(acc / 100.0) + 4.0,
            left + plot_w,
            y(acc / 100.0),
            y(acc / 100.0)
        );
    }
    let _ = writeln!(
        svg,
        r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">{}</text>"#,
        left + plot_w / 2.0,
        height - 12.0,
        cost.label()
    );
    let _ = writeln!(
        svg,
        r#"<text transform="translate(16 {:.1}) rotate(-90)" text-anchor="middle">{metric} (%)</text>"#,
        top + plot_h / 2.0
    );
    let pipelines = ordered(reports.iter().map(|r| r.pipeline.as_str()));
    for r in reports {
        let index = pipelines.iter().position(|p| *p == r.pipeline).unwrap_or(0);
        let color = COLORS[index % COLORS.len()];
        let (px, py) = (x(cost.of(r)), y(accuracy(r)));
        let _ = writeln!(svg, r#"<circle cx="{px:.1}" cy="{py:.1}" r="5" fill="{color}"/>"#);
        let _ = writeln!(
            svg,
            r#"<text x="{:.1}" y="{:.1}" fill="{color}">{}</text>"#,
            px + 7.0,
            py - 5.0,
            escape(&r.dataset)
        );
    }
    for (i, pipeline) in pipelines.iter().enumerate() {
        let (lx, ly) = (left + plot_w + 20.0, top + 10.0 + 20.0 * i as f64);
        let color = COLORS[i % COLORS.len()];
        let _ = writeln!(svg, r#"<circle cx="{lx}" cy="{ly}" r="5" fill="{color}"/>"#);
        let _ = writeln!(svg, r#"<text x="{}" y="{}">{}</text>"#, lx + 10.0, ly + 4.0, escape(pipeline));
    }
    svg.push_str("</svg>\n");
    svg
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(pipeline: &str, dataset: &str, em: f64, calls: f64) -> Report {
        Report {
            pipeline: pipeline.into(),
            dataset: dataset.into(),
            em,
            lenient_em: em,
            cover_em: em + 0.05,
            llm_calls: calls,
            questions: 10,
            ..Report::default()
        }
    }

    #[test]
    fn the_table_has_a_row_per_pipeline_and_a_column_per_dataset() {
        let reports = [
            report("vanilla", "hotpotqa", 0.2, 1.0),
            report("migres", "hotpotqa", 0.4, 7.5),
            report("migres", "musique", 0.1, 9.0),
        ];
        let table = markdown_table(&reports);
        let lines: Vec<&str> = table.lines().collect();
        assert_eq!(lines[0], "| pipeline | hotpotqa | musique |");
        assert_eq!(lines[2], "| vanilla | 20.0 / 20.0 / 25.0 (1.0, n=10) | - |");
        assert_eq!(lines[3], "| migres | 40.0 / 40.0 / 45.0 (7.5, n=10) | 10.0 / 10.0 / 15.0 (9.0, n=10) |");
        assert!(table.contains("EM / lenient EM / cover EM in %"), "without judged reports, no Acc†");
        let judged: Vec<Report> = reports.iter().map(|r| Report { acc_judged: Some(0.5), ..r.clone() }).collect();
        assert!(markdown_table(&judged).contains("| vanilla | 20.0 / 20.0 / 25.0 / 50.0 (1.0, n=10) | - |"));
    }

    #[test]
    fn comparison_md_keeps_the_means_table_and_adds_the_paired_sections() {
        use crate::eval::funnel::Funnel;
        use crate::eval::paired::Run;
        let reports = [report("migres", "hotpotqa", 0.5, 7.5), report("vanilla-s", "hotpotqa", 0.25, 1.0)];
        let run = |name: &str, right: [bool; 4]| Run {
            name: name.into(),
            dataset: "hotpotqa".into(),
            right: (0..4).map(|i| (("hotpotqa".to_string(), format!("q{i}")), right[i])).collect(),
            funnel: Funnel::default(),
        };
        let paired = Comparison::new(
            vec![run("migres", [true, true, false, false]), run("vanilla-s", [false, true, false, false])],
            Vec::new(),
        );
        let md = comparison_markdown(&reports, Some(&paired));
        assert!(md.starts_with(&markdown_table(&reports)), "the means table comes first, unchanged");
        assert!(md.contains("## Paired (EM)"));
        assert!(md.contains("| migres vs vanilla-s | hotpotqa | 4 | 1 | 0 | 3 (1 / 2) | +25.0 | ["), "{md}");
        assert!(md.contains("| migres vs vanilla-s | **pooled** (1 dataset) | 4 |"), "{md}");
        assert_eq!(comparison_markdown(&reports, None), markdown_table(&reports));
    }

    #[test]
    fn the_plot_has_a_dot_per_report() {
        let reports = [report("vanilla", "a&b", 0.2, 1.0), report("migres", "a&b", 0.4, 7.5)];
        let svg = svg_plot(&reports, Cost::Calls);
        assert_eq!(svg.matches("<circle").count(), 4, "two dots and two legend marks");
        let tokens = svg_plot(&reports, Cost::Tokens);
        assert!(tokens.contains("prompt + completion tokens per question") && !svg.contains("tokens per question"));
        // The x axis's first tick, under the axis: calls with a decimal, tokens whole.
        assert!(svg.contains(r#"<text x="60.0" y="408.0" text-anchor="middle">0.0</text>"#), "{svg}");
        assert!(tokens.contains(r#"<text x="60.0" y="408.0" text-anchor="middle">0</text>"#), "{tokens}");
        assert!(svg.contains("a&amp;b"));
        assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
    }
}
