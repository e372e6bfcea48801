//! The execution provider ONNX sessions run on: the CPU, or CUDA for production re-ranking.
//!
//! CUDA needs the GPU build of ONNX Runtime (`LACUNA_ORT=gpu scripts/setup.sh`, onnxruntime-gpu from
//! PyPI) and the CUDA libraries it links. When either is missing, or no GPU is found, the model runs
//! on the CPU and says so once per session in the log: a slower stage, never a silent one.

use ort::ep::{CUDA, ExecutionProvider as _};
use ort::session::builder::SessionBuilder;

use crate::config::ExecutionProvider;

/// The provider sessions will be asked to run on: CUDA when wanted and this ONNX Runtime has it,
/// the CPU otherwise (with a warning when CUDA was wanted).
pub fn expected(wanted: ExecutionProvider) -> ExecutionProvider {
    if wanted == ExecutionProvider::Cuda && !cuda_in_runtime() {
        tracing::warn!(
            "onnx.execution_provider = \"cuda\", but this ONNX Runtime has no CUDA provider (install the GPU \
             build with LACUNA_ORT=gpu scripts/setup.sh): the model runs on the CPU"
        );
        return ExecutionProvider::Cpu;
    }
    wanted
}

/// `builder` with `wanted` registered, and the provider the session will actually run on.
pub fn with_provider(
    builder: SessionBuilder,
    wanted: ExecutionProvider,
) -> Result<(SessionBuilder, ExecutionProvider), String> {
    match expected(wanted) {
        ExecutionProvider::Cpu => Ok((builder, ExecutionProvider::Cpu)),
        ExecutionProvider::Cuda => match builder.with_execution_providers([CUDA::default().build().error_on_failure()])
        {
            Ok(builder) => Ok((builder, ExecutionProvider::Cuda)),
            Err(error) => {
                tracing::warn!(
                    %error,
                    "onnx.execution_provider = \"cuda\", but the CUDA provider did not start (no GPU, or the CUDA \
                     libraries are missing): the model runs on the CPU"
                );
                Ok((error.recover(), ExecutionProvider::Cpu))
            }
        },
    }
}

/// Whether the loaded ONNX Runtime has the CUDA provider (the GPU build; a GPU may still be absent).
pub fn cuda_in_runtime() -> bool {
    CUDA::is_available().unwrap_or(false)
}
