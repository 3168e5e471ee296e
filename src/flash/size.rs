//! Byte sizes as users type them: `16MiB`, `1.5GB`, `512k`, `4096`, `2 GiB`, `1e6`.

/// Parse a byte size.
///
/// A number (integer, decimal or with an exponent such as `1e6`), optional spaces, then an
/// optional unit, case-insensitive:
///
/// | unit | factor |
/// |---|---|
/// | none, `B` | 1 |
/// | `K`, `KiB`, `Ki` | 1024 |
/// | `KB` | 1000 |
/// | `M`, `MiB`, `Mi` / `MB` | 1024² / 1000² |
/// | `G`, `GiB`, `Gi` / `GB` | 1024³ / 1000³ |
/// | `T`, `TiB`, `Ti` / `TB` | 1024⁴ / 1000⁴ |
/// | `P`, `PiB`, `Pi` / `PB` | 1024⁵ / 1000⁵ |
///
/// A bare letter (`K`, `M`, `G`, ...) is binary, as in most command-line tools; `KB`, `MB`, ...
/// are decimal and `KiB`, `MiB`, ... binary. Fractions of a byte are rounded to the nearest byte
/// (`1.5K` = 1536, `0.1K` = 102). Negative values, garbage and sizes past `u64::MAX` are errors.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    if t.is_empty() {
        return Err(
            "empty size: expected a number with an optional unit such as 512K, 16MiB or 1.5GB"
                .into(),
        );
    }
    let hint = "expected a number with an optional unit such as 512K, 16MiB or 1.5GB";
    if t.starts_with('-') {
        return Err(format!("invalid size {s:?}: sizes cannot be negative"));
    }
    let t = t.strip_prefix('+').unwrap_or(t);
    let b = t.as_bytes();
    let mut i = 0;
    // Mantissa: all significant digits as one integer, and how many of them follow the point.
    let mut digits: u128 = 0;
    let mut n_digits = 0usize;
    let mut frac_digits: i64 = 0;
    let mut seen_point = false;
    let mut overflow = false;
    while i < b.len() {
        match b[i] {
            c @ b'0'..=b'9' => {
                match digits
                    .checked_mul(10)
                    .and_then(|d| d.checked_add(u128::from(c - b'0')))
                {
                    Some(d) => digits = d,
                    None => overflow = true,
                }
                n_digits += 1;
                if seen_point {
                    frac_digits += 1;
                }
            }
            b'.' if !seen_point => seen_point = true,
            b'_' if n_digits > 0 => {}
            _ => break,
        }
        i += 1;
    }
    if n_digits == 0 {
        return Err(format!("invalid size {s:?}: {hint}"));
    }
    if overflow {
        return Err(format!(
            "invalid size {s:?}: too large (at most {} bytes)",
            u64::MAX
        ));
    }
    // Optional exponent: e / E, optional sign, digits.
    let mut exp: i64 = 0;
    if i < b.len() && (b[i] == b'e' || b[i] == b'E') {
        let mut j = i + 1;
        let mut neg = false;
        if j < b.len() && (b[j] == b'+' || b[j] == b'-') {
            neg = b[j] == b'-';
            j += 1;
        }
        let start = j;
        while j < b.len() && b[j].is_ascii_digit() {
            j += 1;
        }
        if j > start {
            let e: i64 = t[start..j]
                .parse()
                .map_err(|_| format!("invalid size {s:?}: exponent out of range"))?;
            if e > 60 {
                return Err(format!("invalid size {s:?}: exponent out of range"));
            }
            exp = if neg { -e } else { e };
            i = j;
        }
        // Without digits the `e` is not an exponent; it is left for the unit check to reject.
    }
    let unit = t[i..].trim_start().to_ascii_lowercase();
    let mult: u128 = match unit.as_str() {
        "" | "b" => 1,
        "k" | "ki" | "kib" => 1 << 10,
        "kb" => 1_000,
        "m" | "mi" | "mib" => 1 << 20,
        "mb" => 1_000_000,
        "g" | "gi" | "gib" => 1 << 30,
        "gb" => 1_000_000_000,
        "t" | "ti" | "tib" => 1 << 40,
        "tb" => 1_000_000_000_000,
        "p" | "pi" | "pib" => 1 << 50,
        "pb" => 1_000_000_000_000_000,
        _ => {
            return Err(format!(
                "invalid size {s:?}: unknown unit {:?} (use B, K/KiB, KB, M/MiB, MB, G/GiB, GB, T/TiB, TB)",
                t[i..].trim()
            ));
        }
    };
    let too_large = || format!("invalid size {s:?}: too large (at most {} bytes)", u64::MAX);
    let scale = exp - frac_digits;
    let value = digits.checked_mul(mult).ok_or_else(too_large)?;
    let bytes: u128 = if scale >= 0 {
        let p = 10u128.checked_pow(scale as u32).ok_or_else(too_large)?;
        if value == 0 {
            0
        } else {
            value.checked_mul(p).ok_or_else(too_large)?
        }
    } else {
        match 10u128.checked_pow((-scale) as u32) {
            // Round to the nearest byte.
            Some(p) => (value + p / 2) / p,
            None => 0,
        }
    };
    u64::try_from(bytes).map_err(|_| too_large())
}

/// `n` bytes as a short human string: `64 MiB`, `4 KiB`, `1.5 GiB`, `123 B`.
pub fn format_size(n: u64) -> String {
    const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut v = n as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{n} B")
    } else if (v - v.round()).abs() < 1e-9 {
        format!("{} {}", v.round() as u64, UNITS[u])
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse() {
        let ok: &[(&str, u64)] = &[
            ("0", 0),
            ("4096", 4096),
            ("  4096  ", 4096),
            ("512k", 512 * 1024),
            ("512K", 512 * 1024),
            ("64KiB", 64 * 1024),
            ("64kib", 64 * 1024),
            ("64KB", 64_000),
            ("16MiB", 16 << 20),
            ("16M", 16 << 20),
            ("16MB", 16_000_000),
            ("1.5GB", 1_500_000_000),
            ("1.5G", 3 << 29),
            ("2 GiB", 2 << 30),
            ("1T", 1 << 40),
            ("1TB", 1_000_000_000_000),
            ("1e6", 1_000_000),
            ("1E6", 1_000_000),
            ("2.5e3K", 2_560_000),
            ("1e-3K", 1),
            ("0.1K", 102),
            ("1.5K", 1536),
            ("100B", 100),
            ("+7", 7),
            ("1_000_000", 1_000_000),
            (".5K", 512),
            ("3.", 3),
            ("1Gi", 1 << 30),
            ("18446744073709551615", u64::MAX),
        ];
        for &(s, want) in ok {
            assert_eq!(parse_size(s), Ok(want), "{s}");
        }
    }

    #[test]
    fn bad_sizes_are_errors() {
        let bad: &[(&str, &str)] = &[
            ("", "empty"),
            ("   ", "empty"),
            ("abc", "expected a number"),
            ("K", "expected a number"),
            ("-5", "negative"),
            ("-1MiB", "negative"),
            ("12XB", "unknown unit"),
            ("1.2.3", "unknown unit"),
            ("5 MiB extra", "unknown unit"),
            ("1e", "unknown unit"),
            ("18446744073709551616", "too large"),
            ("16384P", "too large"),
            ("99999999999999999999999999999999999999999", "too large"),
            ("1e61", "exponent"),
            ("nan", "expected a number"),
            ("inf", "expected a number"),
            (".", "expected a number"),
        ];
        for &(s, what) in bad {
            let e = parse_size(s).expect_err(s);
            assert!(e.contains(what), "{s:?}: {e}");
        }
    }

    #[test]
    fn sizes_format() {
        assert_eq!(format_size(123), "123 B");
        assert_eq!(format_size(4096), "4 KiB");
        assert_eq!(format_size(64 << 20), "64 MiB");
        assert_eq!(format_size(3 << 29), "1.5 GiB");
    }
}
