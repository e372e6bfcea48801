//! Pipelines: which stages run, connected by which topics. `migres` is the MIGRES loop; `cli` is the
//! `lacuna` command line on top of it.

pub mod cli;
pub mod input;
pub mod migres;
pub mod observe;
pub mod parts;
