//! `lacuna acls`: the Kafka ACLs each process of a pipeline needs, one rule a line, for
//! `scripts/kafka.sh acls add` (Kafka's Admin API) or to read before writing them with
//! `kafka-acls.sh`. docs/kafka.md's ACL table says the same in words.

use clap::Args;

use crate::config::Settings;
use crate::pipelines::PipelineKind;
use crate::pipelines::acls::{self, CLIENTS};

#[derive(Args)]
pub struct AclsArgs {
    #[arg(long, default_value = "migres")]
    pipeline: PipelineKind,
    /// The processes to list (stage names, or submit, answers, dlq-replay, topics, serve, ingest,
    /// indexer); every one when left out.
    #[arg(long, value_delimiter = ',')]
    only: Vec<String>,
    /// Each process's principal, `{name}` standing for the process's name.
    #[arg(long, default_value = "User:{name}")]
    principal: String,
}

pub fn acls(settings: &Settings, args: AclsArgs) -> anyhow::Result<()> {
    let all: Vec<String> =
        args.pipeline.stages().iter().map(|s| s.name.to_string()).chain(CLIENTS.map(String::from)).collect();
    let names = if args.only.is_empty() { all.clone() } else { args.only.clone() };
    for name in &names {
        let principal = args.principal.replace("{name}", name);
        let Some(needed) = acls::needed(settings, args.pipeline, name, &principal) else {
            anyhow::bail!("{name} is not a process of {}: one of {}", args.pipeline.name(), all.join(", "));
        };
        println!("# {name}");
        needed.iter().for_each(|acl| println!("{}", acl.line()));
    }
    Ok(())
}
