//! Pipelines: which stages run, connected by which topics. Each pipeline declares its stages once
//! (`migres`, `vanilla`, `qpaug`, `raisf`, `rqrag`; see `declaration`); `graph` reads the topology
//! off those declarations and `render` draws it, `kind` names the pipelines, `runner` runs one in
//! this process. Before it does, `startup` loads the `parts` its stages need (index, models) with the
//! `provenance` of their answers, and follows the documents topic; `input` checks the questions.
//! `acls` lists the Kafka ACLs each of a pipeline's processes needs.

pub mod acls;
pub mod declaration;
pub mod graph;
pub mod input;
pub mod kind;
pub mod migres;
pub mod parts;
pub mod provenance;
pub mod qpaug;
pub mod raisf;
pub mod render;
pub mod rqrag;
pub mod runner;
pub mod startup;
pub mod vanilla;

pub use declaration::{StageDecl, StartError};
pub use kind::PipelineKind;
pub use runner::{Pipeline, RunError, Transport};
