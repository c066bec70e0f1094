//! Launch configuration: what a kernel's `launch_param_tags` say about the extents a caller
//! passes after the kernel arguments, and the grid and block dimensions they make.

/// Launch tag whose value, the dynamic shared memory per block in bytes, follows the thread
/// extents (`launch_param::kUseDynamicSharedMemoryTag`).
pub const DYN_SHARED_MEMORY_TAG: &str = "tir.use_dyn_shared_memory";

/// Why launch tags or extents cannot make a launch.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum LaunchError {
    /// A tag that is neither a thread axis nor a known flag.
    #[error("unknown launch tag `{tag}`")]
    UnknownTag {
        /// The tag.
        tag: String,
    },
    /// The caller passed the wrong number of extents.
    #[error("the launch tags {tags:?} need {expected} extents, {found} given")]
    ExtentCount {
        /// The tags.
        tags: Vec<String>,
        /// Values the tags need.
        expected: usize,
        /// Values given.
        found: usize,
    },
    /// An extent larger than a CUDA dimension (`u32`).
    #[error("extent {value} for `{tag}` is out of range (at most {max})")]
    ExtentOutOfRange {
        /// The tag.
        tag: String,
        /// The value given.
        value: u64,
        /// The largest value allowed.
        max: u64,
    },
}

/// Grid and block dimensions of one launch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LaunchDims {
    /// Blocks per grid (x, y, z).
    pub grid: [u32; 3],
    /// Threads per block (x, y, z).
    pub block: [u32; 3],
    /// Dynamic shared memory per block, in bytes.
    pub dyn_shared_memory: u32,
}

/// What a kernel's `launch_param_tags` say (TVM's `LaunchParamConfig`): which axis each passed
/// extent sets, in order, and the flags.
///
/// Axes are `blockIdx.{x,y,z}` (grid) and `threadIdx.{x,y,z}` (block); an axis not tagged is 1.
/// `tir.use_dyn_shared_memory` (or `tirx.` in newer TVM) adds one value after the extents.
/// WebGPU's `paramWriteAccess:[...]` tags are metadata and take no value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LaunchParams {
    /// For each extent a caller passes: its tag and the axis it sets (0 to 2 grid x/y/z, 3 to 5
    /// block x/y/z).
    pub axes: Vec<(String, usize)>,
    /// Whether the dynamic shared memory size follows the extents.
    pub dyn_shared_memory: bool,
    /// `tirx.use_cooperative_launch`: the kernel needs a cooperative launch.
    pub cooperative: bool,
    /// `tirx.use_programtic_dependent_launch` (TVM's spelling).
    pub programmatic_dependent_launch: bool,
}

impl LaunchParams {
    /// Reads the tags.
    pub(crate) fn from_tags<S: AsRef<str>>(tags: &[S]) -> Result<LaunchParams, LaunchError> {
        let mut p = LaunchParams {
            axes: Vec::new(),
            dyn_shared_memory: false,
            cooperative: false,
            programmatic_dependent_launch: false,
        };
        for tag in tags {
            let tag = tag.as_ref();
            let flag = tag.strip_prefix("tirx.").or_else(|| tag.strip_prefix("tir."));
            match flag {
                Some("use_dyn_shared_memory") => p.dyn_shared_memory = true,
                Some("use_cooperative_launch") => p.cooperative = true,
                Some("use_programtic_dependent_launch") => p.programmatic_dependent_launch = true,
                _ if tag.starts_with("paramWriteAccess:") => {}
                _ => {
                    // An axis may be tagged twice (TVM's OpenCL schedules do): each tag takes
                    // one extent, and the later one sets the axis, as TVM's
                    // `LaunchParamConfig` does.
                    let axis = axis_of(tag).ok_or_else(|| LaunchError::UnknownTag { tag: tag.to_owned() })?;
                    p.axes.push((tag.to_owned(), axis));
                }
            }
        }
        Ok(p)
    }

    /// How many values a caller passes after the kernel arguments: one per thread axis, plus
    /// one for the dynamic shared memory.
    pub(crate) fn extent_count(&self) -> usize {
        self.axes.len() + usize::from(self.dyn_shared_memory)
    }

    /// The dimensions for `extents` (thread extents in tag order, then the dynamic shared
    /// memory in bytes when tagged).
    pub fn dims(&self, extents: &[u64]) -> Result<LaunchDims, LaunchError> {
        if extents.len() != self.extent_count() {
            return Err(LaunchError::ExtentCount {
                tags: self.axes.iter().map(|(t, _)| t.clone()).collect(),
                expected: self.extent_count(),
                found: extents.len(),
            });
        }
        let mut work = [1u32; 6];
        for ((tag, axis), &value) in self.axes.iter().zip(extents) {
            // An extent of 0 (a dynamic shape of size 0) leaves the axis at 1, as TVM does.
            if value == 0 {
                continue;
            }
            let v = u32::try_from(value).map_err(|_| LaunchError::ExtentOutOfRange {
                tag: tag.clone(),
                value,
                max: u64::from(u32::MAX),
            })?;
            if let Some(slot) = work.get_mut(*axis) {
                *slot = v;
            }
        }
        let dyn_shared_memory = match extents.get(self.axes.len()) {
            Some(&bytes) if self.dyn_shared_memory => {
                u32::try_from(bytes).map_err(|_| LaunchError::ExtentOutOfRange {
                    tag: DYN_SHARED_MEMORY_TAG.to_owned(),
                    value: bytes,
                    max: u64::from(u32::MAX),
                })?
            }
            _ => 0,
        };
        let [gx, gy, gz, bx, by, bz] = work;
        Ok(LaunchDims { grid: [gx, gy, gz], block: [bx, by, bz], dyn_shared_memory })
    }
}

/// The work-size slot of a thread-axis tag: `blockIdx.x` is 0, `threadIdx.z` is 5.
fn axis_of(tag: &str) -> Option<usize> {
    let (scope, dim) = tag.split_once('.')?;
    let rank = match scope {
        "blockIdx" => 0,
        "threadIdx" => 3,
        _ => return None,
    };
    let dim = match dim {
        "x" => 0,
        "y" => 1,
        "z" => 2,
        _ => return None,
    };
    Some(rank + dim)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn launch_tags() {
        let p = LaunchParams::from_tags(&["blockIdx.x", "threadIdx.x"]).unwrap();
        assert_eq!(p.extent_count(), 2);
        let d = p.dims(&[16, 64]).unwrap();
        assert_eq!((d.grid, d.block, d.dyn_shared_memory), ([16, 1, 1], [64, 1, 1], 0));

        let p = LaunchParams::from_tags(&["threadIdx.y", "blockIdx.z", "threadIdx.x", DYN_SHARED_MEMORY_TAG]).unwrap();
        assert_eq!(p.extent_count(), 4);
        let d = p.dims(&[2, 3, 32, 4096]).unwrap();
        assert_eq!((d.grid, d.block, d.dyn_shared_memory), ([1, 1, 3], [32, 2, 1], 4096));

        let p = LaunchParams::from_tags(&["blockIdx.x", "threadIdx.x", "paramWriteAccess:[0,0,1]"]).unwrap();
        assert_eq!(p.extent_count(), 2);
        assert!(LaunchParams::from_tags(&["tirx.use_cooperative_launch"]).unwrap().cooperative);

        assert_eq!(LaunchParams::from_tags(&["warpIdx.x"]), Err(LaunchError::UnknownTag { tag: "warpIdx.x".into() }));
        // A twice-tagged axis takes two extents; the later one counts.
        let p = LaunchParams::from_tags(&["blockIdx.x", "threadIdx.z", "threadIdx.z"]).unwrap();
        assert_eq!(p.extent_count(), 3);
        assert_eq!(p.dims(&[4, 2, 8]).unwrap().block, [1, 1, 8]);
        let p = LaunchParams::from_tags(&["blockIdx.x"]).unwrap();
        assert!(matches!(p.dims(&[]), Err(LaunchError::ExtentCount { expected: 1, found: 0, .. })));
        assert_eq!(p.dims(&[0]).unwrap().grid, [1, 1, 1], "a 0 extent stays 1");
        assert!(matches!(p.dims(&[1 << 32]), Err(LaunchError::ExtentOutOfRange { .. })));
    }
}
