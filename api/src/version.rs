//! Version strings: "major.minor" versions (CUDA versions and compute capabilities, as the CRD
//! spells a minimum and as the device plugin reads them from the driver or its fake GPU file) and
//! the dotted driver versions (`550.54.15`) the device plugin reads and labels nodes with.

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

/// Whether `s` is decimal numbers joined by single dots (`550`, `550.54.15`): the shape of an
/// NVIDIA driver version, whatever its number of parts. Digits only: no sign, no spaces.
pub fn is_dotted_numbers(s: &str) -> bool {
    s.split('.')
        .all(|part| !part.is_empty() && part.bytes().all(|b| b.is_ascii_digit()))
}

/// Major, minor and (if present) revision of a driver version like `580.159.04`, with
/// surrounding whitespace allowed; `None` unless it is two or three dotted numbers that each
/// fit a `u32`. The revision is kept as the driver writes it (`04`): GPU Feature Discovery
/// labels it so, and the major and minor never have leading zeros.
pub fn parse_driver_version(version: &str) -> Option<(u32, u32, Option<&str>)> {
    let version = version.trim();
    if !is_dotted_numbers(version) {
        return None;
    }
    let mut parts = version.split('.');
    let major = parts.next()?.parse().ok()?;
    let minor = parts.next()?.parse().ok()?;
    let rev = match parts.next() {
        Some(rev) => {
            rev.parse::<u32>().ok()?;
            Some(rev)
        }
        None => None,
    };
    if parts.next().is_some() {
        return None;
    }
    Some((major, minor, rev))
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

    #[test]
    fn driver_versions_are_dotted_numbers_of_any_length() {
        for good in ["550", "550.54.15", "1.2.3.4", "0.0"] {
            assert!(is_dotted_numbers(good), "{good}");
        }
        for bad in [
            "", ".", "550.", ".550", "550..54", "550.x", "+550.54", " 550.54", "5 50",
        ] {
            assert!(!is_dotted_numbers(bad), "{bad:?}");
        }
    }

    #[test]
    fn driver_version_parsing() {
        assert_eq!(
            parse_driver_version("550.54.15"),
            Some((550, 54, Some("15")))
        );
        assert_eq!(
            parse_driver_version("580.159.04"),
            Some((580, 159, Some("04")))
        );
        assert_eq!(parse_driver_version("580.159.99999999999"), None);
        assert_eq!(parse_driver_version("535.104"), Some((535, 104, None)));
        assert_eq!(parse_driver_version(" 535.104\n"), Some((535, 104, None)));
        assert_eq!(parse_driver_version("550"), None);
        assert_eq!(parse_driver_version("550.x.1"), None);
        assert_eq!(parse_driver_version("1.2.3.4"), None);
        assert_eq!(parse_driver_version("+550.54"), None);
        assert_eq!(parse_driver_version("99999999999.1"), None);
    }
}
