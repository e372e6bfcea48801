//! The CPU a run's re-ranker scored on, recorded in run.json. The shipped int8 graph multiplies u8
//! activations by s8 weights; ONNX Runtime does that exactly with VNNI and in saturating 16-bit lanes
//! with AVX2 only (actors/clients/score_cache.rs), so two hosts can differ by a keep decision, and a
//! paired difference between their runs is partly theirs unless the scores came from one score cache.

/// The instruction sets the int8 kernels choose between, as /proc/cpuinfo spells them.
const KERNEL_FLAGS: [&str; 4] = ["avx2", "avx512f", "avx512_vnni", "avx_vnni"];

/// `model name (flags)` of the first processor, e.g. `AMD EPYC (avx2)`; `None` where /proc/cpuinfo
/// cannot be read.
pub fn cpu() -> Option<String> {
    Some(describe(&std::fs::read_to_string("/proc/cpuinfo").ok()?))
}

fn describe(cpuinfo: &str) -> String {
    let field = |name: &str| {
        cpuinfo.lines().find_map(|line| {
            let (key, value) = line.split_once(':')?;
            (key.trim() == name).then(|| value.trim().to_string())
        })
    };
    let model = field("model name").unwrap_or_else(|| "unknown CPU".into());
    let flags = field("flags").unwrap_or_default();
    let present: Vec<&str> = KERNEL_FLAGS.into_iter().filter(|f| flags.split_whitespace().any(|x| x == *f)).collect();
    format!("{model} ({})", present.join(" "))
}

/// The instruction sets in a description [`cpu`] wrote ("AMD EPYC (avx2)" -> "avx2"), which decide
/// how the int8 graph scores; the model name does not. `None` for another shape.
pub fn kernels(cpu: &str) -> Option<&str> {
    let open = cpu.rfind('(')?;
    cpu[open + 1..].strip_suffix(')')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_the_model_and_the_int8_kernels_flags_only() {
        let info = "processor\t: 0\nmodel name\t: Intel Xeon\nflags\t\t: fpu sse avx2 avx512f avx512_vnni avx512bw\n";
        assert_eq!(describe(info), "Intel Xeon (avx2 avx512f avx512_vnni)");
        assert_eq!(describe("flags : avx2\n"), "unknown CPU (avx2)");
    }

    #[test]
    fn the_kernels_read_back_from_a_description() {
        let info = "model name\t: AMD EPYC 7B13 (engineering sample)\nflags\t\t: fpu avx2\n";
        assert_eq!(kernels(&describe(info)), Some("avx2"));
        assert_eq!(kernels(&describe("model name : Intel Xeon\n")), Some(""));
        assert_eq!(kernels("no flags recorded"), None);
    }
}
