//! The `lacuna` binary: see `lacuna --help`. Runs on actix's system runtime, the stages on their own
//! arbiters.

#[actix::main]
async fn main() {
    if let Err(error) = lacuna::cli::main().await {
        eprintln!("error: {error:#}");
        std::process::exit(1);
    }
}
