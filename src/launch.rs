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
