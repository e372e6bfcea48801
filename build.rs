//! Records the git commit the binary is built from as `LACUNA_COMMIT`, which every answer's
//! provenance names. `LACUNA_COMMIT` in the build's environment wins (an image built from a copy
//! without `.git`); else `git rev-parse HEAD`; else "unknown".

use std::path::Path;
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-env-changed=LACUNA_COMMIT");
    let commit = std::env::var("LACUNA_COMMIT")
        .ok()
        .filter(|c| !c.trim().is_empty())
        .or_else(head_commit)
        .unwrap_or_else(|| "unknown".to_string());
    println!("cargo:rustc-env=LACUNA_COMMIT={}", commit.trim());
}

/// The checkout's HEAD, watched so a new commit rebuilds with its id. Only files that exist are
/// watched: cargo reruns a build script on every build while a watched file is missing.
fn head_commit() -> Option<String> {
    let git_dir = git(&["rev-parse", "--git-dir"])?;
    let watch = |path: &Path| {
        if path.exists() {
            println!("cargo:rerun-if-changed={}", path.display());
        }
    };
    let git_dir = Path::new(&git_dir);
    watch(&git_dir.join("HEAD"));
    if let Some(branch) = git(&["symbolic-ref", "-q", "HEAD"]) {
        // A branch's ref is a loose file until `git gc` packs it.
        let loose = git_dir.join(&branch);
        if loose.exists() { watch(&loose) } else { watch(&git_dir.join("packed-refs")) }
    }
    git(&["rev-parse", "HEAD"])
}

fn git(args: &[&str]) -> Option<String> {
    let output = Command::new("git").args(args).output().ok()?;
    output.status.success().then(|| String::from_utf8_lossy(&output.stdout).trim().to_string())
}
