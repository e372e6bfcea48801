//! `lacuna serve`: the HTTP API and live page in front of the pipelines (docs/serve.md).

use clap::Args;

use crate::config::Settings;
use crate::pipelines::parts::{Parts, check_llm};
use crate::pipelines::{PipelineKind, Transport};
use crate::serve::{ServeOptions, start};

#[derive(Args)]
pub struct ServeArgs {
    /// Where to listen (default: serve.listen).
    #[arg(long)]
    listen: Option<String>,
    /// `in-process` (run the stages here; accepted questions live in memory) or `kafka` (submit to
    /// the pipelines' topics and read their answers and progress; the stages run elsewhere).
    #[arg(long, default_value = "in-process")]
    transport: Transport,
    /// A pipeline to serve; repeat for several. The first is the default of questions naming none.
    #[arg(long = "pipeline", default_values = ["migres"])]
    pipelines: Vec<PipelineKind>,
    /// Answer repeated LLM calls from the response cache (llm.cache_dir).
    #[arg(long)]
    llm_cache: bool,
}

pub async fn serve(settings: &Settings, args: ServeArgs) -> anyhow::Result<()> {
    let mut settings = settings.clone();
    settings.llm.cache |= args.llm_cache;
    let served = if args.transport == Transport::InProcess {
        check_llm(&settings).await.map_err(anyhow::Error::msg)?
    } else {
        None
    };
    // /metrics, /healthz and /readyz on metrics.listen too, where every Lacuna pod serves them.
    let probes = crate::serve::observe::start(&settings.metrics.listen).await?;
    let listen = args.listen.unwrap_or_else(|| settings.serve.listen.clone());
    let options = ServeOptions { transport: args.transport, pipelines: args.pipelines.clone(), listen };
    let loaded = settings.clone();
    let mut server =
        start(&settings, options, |kind| Ok(Parts::load(&loaded, kind)?.with_served_model(served.clone()))).await?;
    probes.store(true, std::sync::atomic::Ordering::Relaxed);
    let served: Vec<&str> = args.pipelines.iter().map(|p| p.name()).collect();
    eprintln!(
        "serving {} on http://{} (the live page at /, the API at /v1, /openapi.json)",
        served.join(", "),
        server.address
    );
    let outcome = tokio::select! {
        _ = super::stage::wait_for_shutdown_signal() => Ok(()),
        reason = server.failed() => Err(anyhow::anyhow!("serve stopped: {reason}")),
    };
    let open = server.registry.open();
    if open > 0 && args.transport == Transport::InProcess {
        eprintln!("stopping with {open} questions open: held in memory, they are lost");
    }
    probes.store(false, std::sync::atomic::Ordering::Relaxed);
    server.stop();
    outcome
}
