//! NCCL all-reduce of device buffers, for gangs on NVIDIA GPUs (feature `cuda`).
//!
//! cudarc loads `libcuda` and `libnccl` at run time and panics on any call when
//! they are absent, so [`available`] checks both first and every entry point goes
//! through it: without a GPU this module answers with a clear reason instead.
//! The 128-byte NCCL unique id is made on rank 0 ([`unique_id`]) and handed to the
//! other ranks through the rendezvous beside its address; every rank then decides
//! from the same table whether the gang uses NCCL (`rendezvous::nccl_unique_id`),
//! and `TrialContext::collective()` in the SDK attaches the communicator to the
//! host one (`BlockingCommunicator::nccl`).

use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaSlice, CudaStream};
use cudarc::nccl::safe::{Comm, Id, ReduceOp};

/// Why NCCL cannot be used, or a call failed.
#[derive(Debug, thiserror::Error)]
pub enum NcclError {
    /// A library is missing on this machine.
    #[error("NCCL is not available: {0}")]
    Unavailable(&'static str),
    /// The CUDA driver reported an error.
    #[error("CUDA driver error: {0}")]
    Driver(String),
    /// NCCL reported an error.
    #[error("NCCL error: {0}")]
    Nccl(String),
}

/// Whether the CUDA driver and NCCL libraries can be loaded here.
pub fn available() -> Result<(), NcclError> {
    // SAFETY: these only try to load the shared libraries and look up their symbols.
    if !unsafe { cudarc::driver::sys::is_culib_present() } {
        return Err(NcclError::Unavailable(
            "libcuda was not found (no NVIDIA driver on this machine)",
        ));
    }
    // SAFETY: as above.
    if !unsafe { cudarc::nccl::sys::is_culib_present() } {
        return Err(NcclError::Unavailable(
            "libnccl.so was not found; NCCL from a Python wheel ships only libnccl.so.2: link it as libnccl.so in a directory on LD_LIBRARY_PATH",
        ));
    }
    Ok(())
}

/// Whether this process can join an NCCL communicator: the libraries load and the
/// driver shows it at least one GPU (a node hides the GPUs a worker was not given
/// through `CUDA_VISIBLE_DEVICES`).
pub fn usable_here() -> Result<(), NcclError> {
    available()?;
    let devices =
        CudaContext::device_count().map_err(|error| NcclError::Driver(format!("{error:?}")))?;
    if devices < 1 {
        return Err(NcclError::Unavailable("this process sees no GPU"));
    }
    Ok(())
}

/// A fresh NCCL unique id, made on rank 0 and shared with the other ranks.
pub fn unique_id() -> Result<[u8; 128], NcclError> {
    available()?;
    let id = Id::new().map_err(|error| NcclError::Nccl(format!("{error:?}")))?;
    Ok(id.internal().map(|byte| byte as u8))
}

/// One rank's NCCL communicator on one GPU.
#[derive(Debug)]
pub struct NcclCommunicator {
    comm: Comm,
}

impl NcclCommunicator {
    /// Joins the communicator named by `id` as `rank` of `world_size` on GPU `device`
    /// (an index into `CUDA_VISIBLE_DEVICES`).
    pub fn new(
        device: usize,
        rank: u32,
        world_size: u32,
        id: [u8; 128],
    ) -> Result<Self, NcclError> {
        available()?;
        let context =
            CudaContext::new(device).map_err(|error| NcclError::Driver(format!("{error:?}")))?;
        let stream = context.default_stream();
        let id = Id::uninit(id.map(|byte| byte as core::ffi::c_char));
        let comm = Comm::from_rank(stream, rank as usize, world_size as usize, id)
            .map_err(|error| NcclError::Nccl(format!("{error:?}")))?;
        Ok(Self { comm })
    }

    /// The stream collectives run on; allocate and copy buffers on it.
    pub fn stream(&self) -> Arc<CudaStream> {
        self.comm.stream()
    }

    /// Sums `buffer` over all ranks in place, and waits for the result.
    pub fn all_reduce_sum(&self, buffer: &mut CudaSlice<f32>) -> Result<(), NcclError> {
        self.comm
            .all_reduce_in_place(buffer, &ReduceOp::Sum)
            .map_err(|error| NcclError::Nccl(format!("{error:?}")))?;
        self.stream()
            .synchronize()
            .map_err(|error| NcclError::Driver(format!("{error:?}")))
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::rendezvous::{self, RankAddress};

    /// Whether the GPU tests can run here; says why not. With `XP_GPU_TESTS=1` (the
    /// GPU check script) a machine without a usable GPU fails instead of skipping.
    fn gpu_here() -> bool {
        match usable_here() {
            Ok(()) => true,
            Err(reason) => {
                assert!(
                    std::env::var("XP_GPU_TESTS").as_deref() != Ok("1"),
                    "XP_GPU_TESTS=1 but NCCL cannot run here: {reason}"
                );
                #[expect(clippy::print_stderr, reason = "say why the GPU path was skipped")]
                {
                    eprintln!("skipping the NCCL test: {reason}");
                }
                false
            }
        }
    }

    #[test]
    fn a_one_rank_all_reduce_runs_where_a_gpu_exists() {
        if !gpu_here() {
            return;
        }
        let communicator = NcclCommunicator::new(0, 0, 1, unique_id().unwrap()).unwrap();
        let stream = communicator.stream();
        let mut buffer = stream.clone_htod(&[1.0f32, 2.0, 3.0]).unwrap();
        communicator.all_reduce_sum(&mut buffer).unwrap();
        assert_eq!(stream.clone_dtoh(&buffer).unwrap(), vec![1.0, 2.0, 3.0]);
    }

    #[tokio::test]
    async fn the_unique_id_travels_through_the_rendezvous() {
        if !gpu_here() {
            return;
        }
        let id = unique_id().unwrap();
        let own = RankAddress {
            rank: 0,
            host: "127.0.0.1".to_owned(),
            port: 1,
            machine: rendezvous::machine_id(),
            cert_sha256: None,
            shm_port: None,
            nccl_capable: true,
            nccl_id: Some(id.to_vec()),
        };
        let table = rendezvous::exchange(own, 1, "127.0.0.1", 1, [3; 32], Duration::from_secs(5))
            .await
            .unwrap();
        let joined = rendezvous::nccl_unique_id(&table).expect("a capable gang uses NCCL");
        assert_eq!(joined, id);
        let communicator = NcclCommunicator::new(0, 0, 1, joined).unwrap();
        let stream = communicator.stream();
        let mut buffer = stream.clone_htod(&[0.5f32; 1024]).unwrap();
        communicator.all_reduce_sum(&mut buffer).unwrap();
        assert_eq!(stream.clone_dtoh(&buffer).unwrap(), vec![0.5; 1024]);
    }

    #[test]
    fn without_libraries_the_answer_is_a_reason_not_a_panic() {
        match available() {
            Ok(()) => {}
            Err(error) => {
                assert!(error.to_string().contains("not"));
                // Without the libraries no process can join NCCL, whatever it was given.
                assert!(usable_here().is_err());
            }
        }
    }
}
