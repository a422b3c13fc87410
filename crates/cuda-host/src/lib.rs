//! wick's CUDA kernels built for the CPU, for tests: the same `.cu` sources
//! compiled by the host C++ compiler against `include/wick_cuda.h`, which
//! gives the CUDA built-ins their meaning, and run by `src/emulator.cpp`,
//! each thread of a block a fiber. The emulator is strict: threads run in a
//! seeded random order between barriers, shared memory starts as NaN, and a
//! warp function whose mask names a lane that cannot come fails the launch
//! (see emulator.cpp). docs/architecture.md describes the design.

use std::ffi::{c_char, c_void, CString};

extern "C" {
    fn wick_cuda_host_launch(
        name: *const c_char,
        grid: *const u32,
        block: *const u32,
        seed: u64,
        args: *mut *mut c_void,
        err: *mut c_char,
        err_len: usize,
    ) -> i32;
}

/// One kernel argument's value.
#[derive(Debug, Clone, Copy)]
pub enum Value {
    Ptr(*mut c_void),
    I32(i32),
    U32(u32),
    F32(f32),
}

/// Where a value lives while the kernel reads it: the kernel's thunk reads
/// each parameter through a pointer to its own type, at offset 0.
#[repr(C)]
union Cell {
    ptr: *mut c_void,
    i32: i32,
    u32: u32,
    f32: f32,
}

/// Runs the kernel `name` over `grid` blocks of `block` threads, as
/// `cuLaunchKernel` would, under the emulator's strict scheduling seeded by
/// `seed`. A failure (a thread stuck at a barrier or a warp function, a
/// mask naming a lane that ended, a kernel not in the host build) names the
/// kernel, the block and the seed.
///
/// # Safety
///
/// `args` are the kernel's parameters in order, each of its parameter's
/// type, and every pointer among them is valid for each access the kernel
/// makes with this grid.
pub unsafe fn launch(
    name: &str,
    grid: [u32; 3],
    block: [u32; 3],
    seed: u64,
    args: &[Value],
) -> Result<(), String> {
    let mut cells: Vec<Cell> = args
        .iter()
        .map(|v| match *v {
            Value::Ptr(ptr) => Cell { ptr },
            Value::I32(i32) => Cell { i32 },
            Value::U32(u32) => Cell { u32 },
            Value::F32(f32) => Cell { f32 },
        })
        .collect();
    let mut ptrs: Vec<*mut c_void> = cells
        .iter_mut()
        .map(|c| c as *mut Cell as *mut c_void)
        .collect();
    let name = CString::new(name).map_err(|e| e.to_string())?;
    let mut err = vec![0u8; 4096];
    // SAFETY: `grid` and `block` are three u32 each, `ptrs` points into
    // `cells`, which outlive the call, and `err` is `err.len()` bytes; the
    // caller vouches for the arguments themselves.
    let status = unsafe {
        wick_cuda_host_launch(
            name.as_ptr(),
            grid.as_ptr(),
            block.as_ptr(),
            seed,
            ptrs.as_mut_ptr(),
            err.as_mut_ptr().cast(),
            err.len(),
        )
    };
    match status {
        0 => Ok(()),
        _ => {
            let end = err.iter().position(|&b| b == 0).unwrap_or(err.len());
            Err(String::from_utf8_lossy(&err[..end]).into_owned())
        }
    }
}
