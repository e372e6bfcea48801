//! The `lacuna` binary: see `lacuna --help`. Runs on actix's system runtime, the stages on their own
//! arbiters.

#[actix::main]
async fn main() {
    let outcome = lacuna::cli::main().await;
    // The ONNX sessions go first, in a fixed order, before the runtime and the CUDA driver do; a
    // process that exits early runs the same hooks (`telemetry::exit`).
    lacuna::telemetry::exit::run_exit_hooks();
    if let Err(error) = outcome {
        eprintln!("error: {error:#}");
        std::process::exit(1);
    }
}
