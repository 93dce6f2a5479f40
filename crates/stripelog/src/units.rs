//! Sizes and fractions as people type them: `4GiB`, `1MiB`, `512`, `4G`, `27%`, `0.27`.

/// What `--help` says of sizes: the one rule [`parse_size`] follows (a macro, for `concat!`).
#[macro_export]
macro_rules! size_rule {
    () => {
        "K, M, G, T and KiB, MiB, GiB, TiB are powers of 1024 (256M = 256MiB = 268435456 bytes); \
         KB, MB, GB, TB are powers of 1000, as drive makers count (256MB = 256000000 bytes)"
    };
}
pub const SIZE_RULE: &str = size_rule!();

/// Parse a byte size: a number with an optional binary (KiB, MiB, GiB, TiB; K, M, G, T)
/// or decimal (KB, MB, GB, TB) suffix, case-insensitive ([`SIZE_RULE`]).
pub fn parse_size(text: &str) -> Result<u64, String> {
    let trimmed = text.trim();
    let split = trimmed.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(trimmed.len());
    let (number, suffix) = trimmed.split_at(split);
    let value: f64 = number.parse().map_err(|_| format!("'{text}' is not a size (try 4GiB, 1MiB, 65536)"))?;
    let multiplier: f64 = match suffix.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "k" | "kib" => 1024.0,
        "m" | "mib" => 1024.0 * 1024.0,
        "g" | "gib" => 1024.0 * 1024.0 * 1024.0,
        "t" | "tib" => 1024.0 * 1024.0 * 1024.0 * 1024.0,
        "kb" => 1e3,
        "mb" => 1e6,
        "gb" => 1e9,
        "tb" => 1e12,
        other => return Err(format!("unknown size unit '{other}' in '{text}' (use KiB, MiB, GiB, TiB)")),
    };
    let bytes = value * multiplier;
    if !bytes.is_finite() || bytes < 0.0 || bytes > u64::MAX as f64 || bytes.fract() != 0.0 {
        return Err(format!("'{text}' is not a whole number of bytes"));
    }
    Ok(bytes as u64)
}

/// [`parse_size`] for a size of whole 4 KiB blocks (a logical size): a decimal size that
/// is not one is refused with its binary twin as the hint (`4GB` → "did you mean 4GiB?").
pub fn parse_block_multiple_size(text: &str) -> Result<u64, String> {
    const BLOCK_BYTES: u64 = 4096;
    let bytes = parse_size(text)?;
    if bytes.is_multiple_of(BLOCK_BYTES) {
        return Ok(bytes);
    }
    let trimmed = text.trim();
    let binary = ["KB", "MB", "GB", "TB"].iter().find_map(|unit| {
        let number = trimmed.get(..trimmed.len().checked_sub(unit.len())?)?;
        trimmed[number.len()..].eq_ignore_ascii_case(unit).then(|| format!("{}{}iB", number.trim(), &unit[..1]))
    });
    let hint = match binary.filter(|binary| parse_size(binary).is_ok_and(|bytes| bytes.is_multiple_of(BLOCK_BYTES))) {
        Some(binary) => format!(": did you mean {binary}? ({SIZE_RULE})"),
        None => format!(
            " (the nearest are {} and {})",
            bytes / BLOCK_BYTES * BLOCK_BYTES,
            bytes.div_ceil(BLOCK_BYTES) * BLOCK_BYTES
        ),
    };
    Err(format!("'{text}' is {bytes} bytes, not a multiple of 4096 (whole 4 KiB blocks){hint}"))
}

/// `on` or `off` (also `yes`/`no`, `true`/`false`).
pub fn parse_on_off(text: &str) -> Result<bool, String> {
    match text.to_ascii_lowercase().as_str() {
        "on" | "yes" | "true" => Ok(true),
        "off" | "no" | "false" => Ok(false),
        _ => Err(format!("{text}: expected on or off")),
    }
}

/// Parse a fraction as parts per million: `27%`, `27 %` or `0.27`.
pub fn parse_fraction_ppm(text: &str) -> Result<u32, String> {
    let trimmed = text.trim();
    let value = match trimmed.strip_suffix('%') {
        Some(percent) => percent.trim().parse::<f64>().map(|value| value / 100.0),
        None => trimmed.parse::<f64>(),
    }
    .map_err(|_| format!("'{text}' is not a fraction (try 20% or 0.2)"))?;
    // A bare number of 1 or more is a percentage written without its sign: refused (a
    // bare 1 could mean 1 % as well as all of it), with the hint.
    if !trimmed.ends_with('%') && (1.0..100.0).contains(&value) {
        return Err(format!("'{text}' is not a fraction: did you mean {trimmed}%? (a share is written 27% or 0.27)"));
    }
    if !(0.0..1.0).contains(&value) {
        return Err(format!("'{text}' must be at least 0 % and below 100 %"));
    }
    Ok((value * 1_000_000.0).round() as u32)
}

/// Parse a duration: `10s`, `500ms`, `2m`, or plain seconds.
pub fn parse_duration(text: &str) -> Result<std::time::Duration, String> {
    let trimmed = text.trim();
    let (number, scale) = if let Some(value) = trimmed.strip_suffix("ms") {
        (value, 1e-3)
    } else if let Some(value) = trimmed.strip_suffix('s') {
        (value, 1.0)
    } else if let Some(value) = trimmed.strip_suffix('m') {
        (value, 60.0)
    } else {
        (trimmed, 1.0)
    };
    let seconds: f64 = number.trim().parse().map_err(|_| format!("'{text}' is not a duration (try 10s, 500ms)"))?;
    if !seconds.is_finite() || seconds <= 0.0 {
        return Err(format!("'{text}' must be a positive duration"));
    }
    Ok(std::time::Duration::from_secs_f64(seconds * scale))
}

/// `1536` → `1.5 KiB`.
pub fn format_bytes(bytes: u64) -> String {
    const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit < UNITS.len() - 1 {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} B")
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}

/// `0.000042` → `42 µs`, `75.2` → `1 min 15 s`, `93784` → `1 d 2 h`: a time as a person reads it.
pub fn format_seconds(seconds: f64) -> String {
    if !seconds.is_finite() || seconds < 0.0 {
        return "?".into();
    }
    if seconds < 1e-3 {
        return format!("{:.0} µs", seconds * 1e6);
    }
    if seconds < 1.0 {
        return format!("{:.1} ms", seconds * 1e3);
    }
    if seconds < 60.0 {
        return format!("{seconds:.1} s");
    }
    let whole = seconds as u64;
    if whole < 3_600 {
        format!("{} min {} s", whole / 60, whole % 60)
    } else if whole < 86_400 {
        format!("{} h {} min", whole / 3_600, whole % 3_600 / 60)
    } else {
        format!("{} d {} h", whole / 86_400, whole % 86_400 / 3_600)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse() {
        let cases: &[(&str, Result<u64, ()>)] = &[
            ("4GiB", Ok(4 << 30)),
            ("1MiB", Ok(1 << 20)),
            ("64k", Ok(64 << 10)),
            ("65536", Ok(65536)),
            ("1.5KiB", Ok(1536)),
            ("2GB", Ok(2_000_000_000)),
            ("4 GiB", Ok(4 << 30)),
            ("", Err(())),
            ("GiB", Err(())),
            ("4XB", Err(())),
            ("0.3", Err(())),
            ("-1", Err(())),
        ];
        for (text, expected) in cases {
            assert_eq!(parse_size(text).map_err(|_| ()), *expected, "{text}");
        }
    }

    #[test]
    fn a_size_that_is_not_whole_blocks_suggests_its_binary_twin() {
        assert_eq!(parse_block_multiple_size("4GiB"), Ok(4 << 30));
        assert_eq!(parse_block_multiple_size("4096MB"), Ok(4_096_000_000));
        let error = parse_block_multiple_size("4GB").unwrap_err();
        assert!(error.contains("did you mean 4GiB?") && error.contains("4000000000 bytes"), "{error}");
        let error = parse_block_multiple_size("1.5 gb").unwrap_err();
        assert!(error.contains("did you mean 1.5GiB?"), "{error}");
        let error = parse_block_multiple_size("5000").unwrap_err();
        assert!(error.contains("4096 and 8192"), "{error}");
        // 256M and 256MiB are one size; 256MB is the decimal one.
        assert_eq!(parse_size("256M"), parse_size("256MiB"));
        assert_eq!(parse_size("256MB"), Ok(256_000_000));
    }

    #[test]
    fn a_bare_percentage_gets_its_sign_as_the_hint() {
        let error = parse_fraction_ppm("27").unwrap_err();
        assert!(error.contains("did you mean 27%?"), "{error}");
        assert!(parse_fraction_ppm("1").unwrap_err().contains("did you mean 1%?"));
        assert!(parse_fraction_ppm("100").is_err());
    }

    #[test]
    fn fractions_parse() {
        assert_eq!(parse_fraction_ppm("27%"), Ok(270_000));
        assert_eq!(parse_fraction_ppm("0.2"), Ok(200_000));
        assert_eq!(parse_fraction_ppm("7 %"), Ok(70_000));
        assert!(parse_fraction_ppm("100%").is_err());
        assert!(parse_fraction_ppm("-5%").is_err());
        assert!(parse_fraction_ppm("lots").is_err());
    }

    #[test]
    fn durations_and_formatting() {
        assert_eq!(parse_duration("10s"), Ok(std::time::Duration::from_secs(10)));
        assert_eq!(parse_duration("500ms"), Ok(std::time::Duration::from_millis(500)));
        assert!(parse_duration("0s").is_err());
        assert_eq!(format_bytes(1536), "1.5 KiB");
        assert_eq!(format_bytes(512), "512 B");
        assert_eq!(format_seconds(0.000042), "42 µs");
        assert_eq!(format_seconds(0.0025), "2.5 ms");
        assert_eq!(format_seconds(75.2), "1 min 15 s");
        assert_eq!(format_seconds(93_784.0), "1 d 2 h");
    }
}
