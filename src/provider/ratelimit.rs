//! A refused request's timing, read from the provider's response headers as untrusted input:
//! how long it asked the caller to wait (`Retry-After`) and when the limit it hit resets. A run
//! error records both (`crate::record::ProviderError`), so `run.status` and `session.head` serve
//! the provider's own numbers (llm-runner §4.3 and §6: `retry_after_secs`, `resets_at_ms`).
//!
//! Reset times come from the rate-limit headers the providers document:
//!
//! | family | remaining | reset |
//! |---|---|---|
//! | OpenAI (and compatibles) | `x-ratelimit-remaining-{requests,tokens}` | `x-ratelimit-reset-{requests,tokens}`: a duration (`1s`, `6m0s`, `20ms`) from now |
//! | Anthropic | `anthropic-ratelimit-{requests,tokens,input-tokens,output-tokens}-remaining` | `anthropic-ratelimit-…-reset`: an RFC 3339 time |
//!
//! Only a limit the headers show exhausted (remaining `0`) says when *this* refusal ends; with
//! several, the latest reset is the one that frees the request. Nothing here panics, and a value
//! that does not parse is ignored (the error is recorded without it).

/// The furthest wait or reset taken from a header (400 days: an account's monthly or yearly
/// limit included); beyond it the value is noise.
const HORIZON_MS: u64 = 400 * 24 * 3600 * 1000;

/// OpenAI's limits (`x-ratelimit-remaining-<kind>`, `x-ratelimit-reset-<kind>`).
const OPENAI_KINDS: [&str; 2] = ["requests", "tokens"];
/// Anthropic's limits (`anthropic-ratelimit-<kind>-remaining`, `…-reset`).
const ANTHROPIC_KINDS: [&str; 4] = ["requests", "tokens", "input-tokens", "output-tokens"];

/// A `Retry-After` in seconds (fractional allowed), as milliseconds rounded up. `None` for
/// anything that is not a finite, non-negative number of seconds (an HTTP date included), so
/// a missing or unusable value is never recorded as 0.
pub fn retry_after_ms(value: &str) -> Option<u64> {
    let secs = value.trim().parse::<f64>().ok().filter(|s| s.is_finite() && *s >= 0.0)?;
    Some(((secs * 1000.0).ceil() as u64).min(HORIZON_MS))
}

/// When the exhausted limit the headers name resets (unix ms), `now_ms` being when the answer
/// arrived; `None` when no limit is shown exhausted with a reset that parses.
pub fn resets_at_ms(header: &dyn Fn(&str) -> Option<String>, now_ms: u64) -> Option<u64> {
    let exhausted = |name: String| header(&name).is_some_and(|v| v.trim() == "0");
    let openai = OPENAI_KINDS.iter().filter(|k| exhausted(format!("x-ratelimit-remaining-{k}"))).filter_map(|k| {
        let wait = duration_ms(&header(&format!("x-ratelimit-reset-{k}"))?)?;
        now_ms.checked_add(wait.min(HORIZON_MS))
    });
    let anthropic = ANTHROPIC_KINDS
        .iter()
        .filter(|k| exhausted(format!("anthropic-ratelimit-{k}-remaining")))
        .filter_map(|k| rfc3339_ms(&header(&format!("anthropic-ratelimit-{k}-reset"))?))
        .filter(|at| *at <= now_ms.saturating_add(HORIZON_MS));
    openai.chain(anthropic).max()
}

/// A Go-style duration as OpenAI writes its resets (`1s`, `6m0s`, `59.981s`, `20ms`, `1h2m`),
/// in milliseconds rounded up.
fn duration_ms(text: &str) -> Option<u64> {
    let mut rest = text.trim();
    if rest.is_empty() {
        return None;
    }
    let mut total = 0f64;
    while !rest.is_empty() {
        let digits = rest.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(rest.len());
        let number: f64 = rest[..digits].parse().ok()?;
        rest = &rest[digits..];
        let unit = rest.find(|c: char| c.is_ascii_digit() || c == '.').unwrap_or(rest.len());
        let scale = match &rest[..unit] {
            "h" => 3_600_000.0,
            "m" => 60_000.0,
            "s" => 1_000.0,
            "ms" => 1.0,
            "us" | "µs" => 0.001,
            "ns" => 0.000_001,
            _ => return None,
        };
        rest = &rest[unit..];
        total += number * scale;
    }
    (total.is_finite() && total <= HORIZON_MS as f64).then(|| total.ceil() as u64)
}

/// An RFC 3339 time (`2026-09-21T14:13:23Z`, with optional fraction and `±hh:mm` offset) as
/// unix milliseconds; `None` for anything else or a time before the epoch.
fn rfc3339_ms(text: &str) -> Option<u64> {
    let t = text.trim().as_bytes();
    let num = |from: usize, len: usize| -> Option<i64> {
        let s = std::str::from_utf8(t.get(from..from + len)?).ok()?;
        s.bytes().all(|b| b.is_ascii_digit()).then(|| s.parse().ok())?
    };
    let sep = |at: usize, any: &[u8]| t.get(at).is_some_and(|b| any.contains(b));
    if !(sep(4, b"-") && sep(7, b"-") && sep(10, b"Tt ") && sep(13, b":") && sep(16, b":")) {
        return None;
    }
    let (year, month, day) = (num(0, 4)?, num(5, 2)?, num(8, 2)?);
    let (hour, minute, second) = (num(11, 2)?, num(14, 2)?, num(17, 2)?);
    if !(1..=12).contains(&month) || !(1..=31).contains(&day) || hour > 23 || minute > 59 || second > 60 {
        return None;
    }
    let mut at = 19;
    let mut millis = 0i64;
    if t.get(at) == Some(&b'.') {
        let digits = t[at + 1..].iter().take_while(|b| b.is_ascii_digit()).count();
        if digits == 0 {
            return None;
        }
        let frac = std::str::from_utf8(&t[at + 1..at + 1 + digits.min(3)]).ok()?;
        millis = format!("{frac:0<3}").parse().ok()?;
        at += 1 + digits;
    }
    let offset_min = match t.get(at) {
        Some(b'Z' | b'z') if at + 1 == t.len() => 0,
        Some(sign @ (b'+' | b'-')) if at + 6 == t.len() && sep(at + 3, b":") => {
            let minutes = num(at + 1, 2)? * 60 + num(at + 4, 2)?;
            if *sign == b'+' {
                minutes
            } else {
                -minutes
            }
        }
        _ => return None,
    };
    let days = days_from_civil(year, month, day);
    let secs = days * 86_400 + hour * 3600 + minute * 60 + second - offset_min * 60;
    u64::try_from(secs.checked_mul(1000)?.checked_add(millis)?).ok()
}

/// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's algorithm).
fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers<'a>(pairs: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |name| pairs.iter().find(|(k, _)| k.eq_ignore_ascii_case(name)).map(|(_, v)| (*v).to_owned())
    }

    #[test]
    fn retry_after_keeps_fractions_and_refuses_stand_ins() {
        assert_eq!(retry_after_ms("1.5"), Some(1500));
        assert_eq!(retry_after_ms(" 2 "), Some(2000));
        assert_eq!(retry_after_ms("0"), Some(0));
        for bad in ["-3", "NaN", "inf", "", "Wed, 21 Oct 2015 07:28:00 GMT", "1e400"] {
            assert_eq!(retry_after_ms(bad), None, "{bad}");
        }
        assert_eq!(retry_after_ms("99999999"), Some(HORIZON_MS));
    }

    #[test]
    fn openai_resets_are_durations_from_now() {
        let h = [
            ("x-ratelimit-remaining-requests", "0"),
            ("x-ratelimit-reset-requests", "1m0.5s"),
            ("x-ratelimit-remaining-tokens", "1200"),
            ("x-ratelimit-reset-tokens", "6m0s"),
        ];
        assert_eq!(resets_at_ms(&headers(&h), 1_000), Some(1_000 + 60_500));
        let none_spent = [("x-ratelimit-remaining-requests", "3"), ("x-ratelimit-reset-requests", "1s")];
        assert_eq!(resets_at_ms(&headers(&none_spent), 1_000), None);
        let both = [
            ("x-ratelimit-remaining-requests", "0"),
            ("x-ratelimit-reset-requests", "20ms"),
            ("x-ratelimit-remaining-tokens", "0"),
            ("x-ratelimit-reset-tokens", "1h2m3s"),
        ];
        assert_eq!(resets_at_ms(&headers(&both), 0), Some(3_723_000));
        for bad in ["", "s", "1x", "1.2.3s", "-1s", "999999h"] {
            let h = [("x-ratelimit-remaining-tokens", "0"), ("x-ratelimit-reset-tokens", bad)];
            assert_eq!(resets_at_ms(&headers(&h), 0), None, "{bad}");
        }
    }

    #[test]
    fn anthropic_resets_are_rfc3339_times() {
        assert_eq!(rfc3339_ms("1970-01-01T00:00:00Z"), Some(0));
        assert_eq!(rfc3339_ms("2026-09-21T14:13:23Z"), Some(1_790_000_003_000));
        assert_eq!(rfc3339_ms("2026-09-21T14:13:23.5Z"), Some(1_790_000_003_500));
        assert_eq!(rfc3339_ms("2026-09-21T16:13:23+02:00"), Some(1_790_000_003_000));
        for bad in ["", "2026-09-21", "2026-13-01T00:00:00Z", "1969-12-31T23:59:59Z", "2026-09-21T10:13:23", "x"] {
            assert_eq!(rfc3339_ms(bad), None, "{bad}");
        }
        let h = [
            ("anthropic-ratelimit-output-tokens-remaining", "0"),
            ("anthropic-ratelimit-output-tokens-reset", "2026-09-21T14:13:23Z"),
            ("anthropic-ratelimit-requests-remaining", "40"),
            ("anthropic-ratelimit-requests-reset", "2026-09-21T14:20:00Z"),
        ];
        assert_eq!(resets_at_ms(&headers(&h), 1_790_000_000_000), Some(1_790_000_003_000));
    }
}
