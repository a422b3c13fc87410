//! A CUDA kernel launch as data: the entry point, its grid and block, and
//! its arguments in the kernel's parameter order, buffers named by role.
//! The code that launches on a GPU and the kernel tests, which also run
//! the same launches on the host build of the kernels (`crates/cuda-host`),
//! read one description, so the tests check the shapes and argument lists
//! the GPU gets.

/// One launch of a kernel.
#[derive(Debug, Clone, PartialEq)]
pub struct Launch<B> {
    pub kernel: String,
    pub grid: (u32, u32, u32),
    pub block: (u32, u32, u32),
    pub args: Vec<Arg<B>>,
}

/// One argument: a buffer by its role `B`, or a scalar.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Arg<B> {
    Buf(B),
    I32(i32),
    U32(u32),
    F32(f32),
}

/// Launching a planned [`Launch`] on a CUDA device.
#[cfg(feature = "cuda")]
pub mod cuda {
    use candle_core::cuda_backend::cudarc::driver::{
        CudaFunction, CudaStream, LaunchArgs, LaunchConfig, PushKernelArg,
    };
    use candle_core::cuda_backend::WrapErr;
    use candle_core::Result;

    use super::{Arg, Launch};

    /// Launches `func` (the entry point `launch.kernel` names, from
    /// `CudaDevice::get_or_load_custom_func`) on `stream` (the device's,
    /// `CudaDevice::cuda_stream`) with `launch`'s grid and block, no dynamic shared
    /// memory, and its arguments in order: scalars as planned, and each
    /// buffer as `buf` pushes it for its role.
    ///
    /// # Safety
    ///
    /// As `cuLaunchKernel`'s: what `buf` pushes for each role must be the
    /// type the kernel's parameter in that place expects, and each buffer
    /// must be as long as the kernel reads and writes it for this grid.
    /// Memory the kernel writes must not be read by the host, or by other
    /// streams, until the stream has run it.
    pub unsafe fn launch<'a, B: Copy>(
        stream: &'a CudaStream,
        func: &'a CudaFunction,
        launch: &'a Launch<B>,
        mut buf: impl FnMut(&mut LaunchArgs<'a>, B),
    ) -> Result<()> {
        let mut b = stream.launch_builder(func);
        for arg in &launch.args {
            match arg {
                Arg::Buf(role) => buf(&mut b, *role),
                Arg::I32(x) => {
                    b.arg(x);
                }
                Arg::U32(x) => {
                    b.arg(x);
                }
                Arg::F32(x) => {
                    b.arg(x);
                }
            }
        }
        let cfg = LaunchConfig {
            grid_dim: launch.grid,
            block_dim: launch.block,
            shared_mem_bytes: 0,
        };
        // SAFETY: the caller's, above.
        unsafe { b.launch(cfg) }.w()?;
        Ok(())
    }
}
