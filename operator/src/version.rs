//! "major.minor" versions: a job's minimum CUDA version and compute capability, and the
//! node labels they are compared with.

/// A "major.minor" minimum.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Version {
    /// Major.
    pub major: u32,
    /// Minor.
    pub minor: u32,
}

impl Version {
    /// Parses "12.4" (validated by the CRD pattern, checked again here).
    pub fn parse(s: &str) -> Option<Self> {
        let (major, minor) = s.trim().split_once('.')?;
        Some(Self {
            major: major.parse().ok()?,
            minor: minor.parse().ok()?,
        })
    }
}

impl std::fmt::Display for Version {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}", self.major, self.minor)
    }
}
