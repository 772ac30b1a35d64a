//! "major.minor" versions: CUDA versions and compute capabilities, as the CRD spells a minimum
//! and as the device plugin reads them from the driver or its fake GPU file.

use std::fmt;
use std::str::FromStr;

/// A "major.minor" version; ordered by major, then minor.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Version {
    /// Major.
    pub major: u32,
    /// Minor.
    pub minor: u32,
}

impl Version {
    /// Parses "12.4" with surrounding whitespace allowed (a CRD value: validated by the CRD
    /// pattern, checked again here); `None` when it is not a version.
    pub fn parse(s: &str) -> Option<Self> {
        s.trim().parse().ok()
    }
}

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.major, self.minor)
    }
}

/// Why a string is not `"<major>.<minor>"`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum VersionError {
    /// There is no dot.
    NoDot(String),
    /// The part before the dot is not a decimal number.
    Major(String),
    /// The part after the dot is not a decimal number.
    Minor(String),
}

impl fmt::Display for VersionError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            VersionError::NoDot(s) => write!(f, "expected \"<major>.<minor>\", got {s:?}"),
            VersionError::Major(s) => write!(f, "major version in {s:?} is not a number"),
            VersionError::Minor(s) => write!(f, "minor version in {s:?} is not a number"),
        }
    }
}

impl std::error::Error for VersionError {}

impl FromStr for Version {
    type Err = VersionError;

    /// Parses exactly `"<major>.<minor>"`, both parts decimal, nothing around them.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (major, minor) = s
            .split_once('.')
            .ok_or_else(|| VersionError::NoDot(s.to_owned()))?;
        Ok(Self {
            major: major
                .parse()
                .map_err(|_| VersionError::Major(s.to_owned()))?,
            minor: minor
                .parse()
                .map_err(|_| VersionError::Minor(s.to_owned()))?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_version_is_two_decimal_numbers_around_one_dot() {
        assert_eq!(
            "12.4".parse(),
            Ok(Version {
                major: 12,
                minor: 4
            })
        );
        assert_eq!(
            "12".parse::<Version>().unwrap_err().to_string(),
            r#"expected "<major>.<minor>", got "12""#
        );
        assert_eq!(
            "x.4".parse::<Version>().unwrap_err().to_string(),
            r#"major version in "x.4" is not a number"#
        );
        assert_eq!(
            "12.4.1".parse::<Version>().unwrap_err().to_string(),
            r#"minor version in "12.4.1" is not a number"#
        );
    }

    #[test]
    fn a_crd_value_may_carry_surrounding_whitespace_but_the_strict_form_may_not() {
        assert_eq!(
            Version::parse(" 8.0 "),
            Some(Version { major: 8, minor: 0 })
        );
        assert!(" 8.0".parse::<Version>().is_err());
        assert_eq!(Version::parse("twelve"), None);
    }

    #[test]
    fn versions_order_by_major_then_minor_and_print_as_parsed() {
        assert!(
            Version {
                major: 12,
                minor: 0
            } > Version {
                major: 11,
                minor: 8
            }
        );
        assert_eq!(
            Version {
                major: 12,
                minor: 4
            }
            .to_string(),
            "12.4"
        );
    }
}
