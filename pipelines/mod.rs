//! Pipelines: which stages run, connected by which topics. `migres` is the MIGRES loop, `vanilla` the
//! paper's retrieve-then-read baselines, `qpaug`, `raisf` and `rqrag` the sibling methods (papers
//! 002-004), `pipeline` runs any of them; `cli` is the `lacuna` command line on top.

pub mod cli;
pub mod input;
pub mod migres;
pub mod observe;
pub mod parts;
pub mod pipeline;
pub mod qpaug;
pub mod raisf;
pub mod rqrag;
pub mod vanilla;
