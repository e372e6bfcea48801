//! The `lacuna` binary: see `lacuna --help`. Runs on actix's system runtime, the stages on their own
//! arbiters.

use lacuna::actors::clients::onnx::release_sessions;

#[actix::main]
async fn main() {
    let outcome = lacuna::cli::main().await;
    // The ONNX sessions go first, in a fixed order, before the runtime and the CUDA driver do.
    release_sessions();
    if let Err(error) = outcome {
        eprintln!("error: {error:#}");
        std::process::exit(1);
    }
}
