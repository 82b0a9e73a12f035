//! The seeded generator and the mutators every target shares: byte-level (flip, set, insert,
//! delete, duplicate, splice, truncate, hostile bytes) and JSON-level (swap a node for another
//! type, a huge or fractional number, a long or hostile string, deep nesting, an unknown member,
//! a removed member), so a mutant keeps most of a real input's structure.

use serde_json::{json, Map, Value};

/// One case's randomness.
pub struct Gen {
    rng: fastrand::Rng,
}

/// SplitMix64: spreads (seed, case) into independent generator seeds.
fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Bytes that break parsers: NUL, high bytes, invalid and overlong UTF-8, a lone surrogate, CR.
const HOSTILE_BYTES: &[&[u8]] = &[
    b"\0",
    b"\xff",
    b"\xc3\x28",
    b"\xed\xa0\x80",
    b"\xf0\x28\x8c\x28",
    b"\xc0\xaf",
    b"\r",
    b"\n",
    b"\r\n\r\n",
    b"\"",
    b"\\",
    b"\\u0000",
    b"\\ud800",
    b"{",
    b"[",
    b"}",
    b"]",
    b":",
    b",",
    b"1e999",
    b"-0",
    b"18446744073709551616",
];

/// Numbers that break arithmetic: bounds, negatives, fractions, huge floats.
fn hostile_number(g: &mut Gen) -> Value {
    match g.below(12) {
        0 => json!(0),
        1 => json!(-1),
        2 => json!(u64::MAX),
        3 => json!(i64::MIN),
        4 => json!(u64::from(u32::MAX) + 1),
        5 => json!(1.5),
        6 => json!(1e300),
        7 => json!(-1e300),
        8 => json!(f64::MIN_POSITIVE),
        9 => json!(9_007_199_254_740_993u64),
        10 => json!(u32::MAX),
        _ => json!(g.below(1 << 20)),
    }
}

/// Strings that break validators: empty, blank, control characters, non-ASCII, NaN-ish, long.
fn hostile_string(g: &mut Gen) -> String {
    match g.below(12) {
        0 => String::new(),
        1 => " \t ".into(),
        2 => "a\u{0}b\nc\u{7f}".into(),
        3 => "é😀\u{202e}\u{feff}".into(),
        4 => ["NaN", "Infinity", "-inf", "1e999", "0x10", "-0", " 7 "][g.below(7)].into(),
        5 => "x".repeat(g.range(200, 70_000)),
        6 => "é".repeat(g.range(1, 40_000)),
        7 => "m".to_string() + &"9".repeat(g.range(1, 40)),
        8 => "h1.x.older.18446744073709551616".into(),
        9 => "../../etc/passwd".into(),
        10 => "%s%n{}\\".into(),
        _ => (0..g.range(1, 12)).map(|_| char::from(b'a' + g.below(26) as u8)).collect(),
    }
}

impl Gen {
    pub fn new(seed: u64, case: u64) -> Gen {
        Gen { rng: fastrand::Rng::with_seed(mix(mix(seed) ^ case)) }
    }

    /// A number in `0..n` (`n > 0`).
    pub fn below(&mut self, n: usize) -> usize {
        self.rng.usize(..n.max(1))
    }

    /// A number in `lo..hi` (`hi > lo`).
    pub fn range(&mut self, lo: usize, hi: usize) -> usize {
        self.rng.usize(lo..hi.max(lo + 1))
    }

    pub fn chance(&mut self, one_in: usize) -> bool {
        self.below(one_in) == 0
    }

    pub fn byte(&mut self) -> u8 {
        self.rng.u8(..)
    }

    pub fn u64(&mut self) -> u64 {
        self.rng.u64(..)
    }

    pub fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len())]
    }

    /// `n` random bytes.
    pub fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.byte()).collect()
    }

    /// One byte-level mutation of `b` in place; `other` is splice material.
    pub fn mutate_bytes_once(&mut self, b: &mut Vec<u8>, other: &[u8]) {
        let len = b.len();
        let at = self.below(len + 1);
        match self.below(10) {
            0 | 1 if len > 0 => {
                let i = self.below(len);
                b[i] ^= 1 << self.below(8);
            }
            2 if len > 0 => {
                let i = self.below(len);
                b[i] = self.byte();
            }
            3 => {
                let n = self.range(1, 9);
                let bytes = self.bytes(n);
                b.splice(at..at, bytes);
            }
            4 if len > 0 => {
                let end = (at + self.range(1, 64)).min(len);
                b.drain(at.min(len)..end);
            }
            5 if len > 0 => {
                let start = self.below(len);
                let end = (start + self.range(1, 256)).min(len);
                let chunk = b[start..end].to_vec();
                b.splice(at..at, chunk);
            }
            6 if !other.is_empty() => {
                let start = self.below(other.len());
                let end = (start + self.range(1, 512)).min(other.len());
                let cut = self.below(len + 1);
                let end_here = (cut + self.below(256)).min(len);
                b.splice(cut..end_here, other[start..end].iter().copied());
            }
            7 => b.truncate(at),
            _ => {
                let hostile = *self.pick(HOSTILE_BYTES);
                b.splice(at..at, hostile.iter().copied());
            }
        }
    }

    /// One to a few byte mutations.
    pub fn mutate_bytes(&mut self, b: &mut Vec<u8>, other: &[u8]) {
        for _ in 0..self.range(1, 4) {
            self.mutate_bytes_once(b, other);
        }
    }

    /// A hostile value of some JSON type.
    pub fn hostile_value(&mut self) -> Value {
        match self.below(9) {
            0 => Value::Null,
            1 => Value::Bool(self.chance(2)),
            2 | 3 => hostile_number(self),
            4 | 5 => Value::String(hostile_string(self)),
            6 => json!([]),
            7 => json!({}),
            _ => self.deep(),
        }
    }

    /// Deeply nested arrays or objects (past serde_json's recursion limit now and then).
    pub fn deep(&mut self) -> Value {
        let depth = self.range(2, 300);
        let mut v = Value::Null;
        for i in 0..depth {
            v = if i % 2 == 0 { json!([v]) } else { json!({"a": v}) };
        }
        v
    }

    /// A member name: usually one of `known` (so mutations reach past the unknown-member check),
    /// sometimes an invented or hostile one.
    pub fn member(&mut self, known: &[&str]) -> String {
        if !known.is_empty() && !self.chance(4) {
            return (*self.pick(known)).to_string();
        }
        hostile_string(self)
    }

    /// Replaces one node of `v` (chosen by a random walk) with a hostile value, or mutates the
    /// object it is in (adds a member named from `names`, removes one).
    pub fn mutate_json_once(&mut self, v: &mut Value, names: &[&str]) {
        let mut node = v;
        loop {
            let descend = self.below(3) != 0;
            let next_index = match &*node {
                Value::Object(m) if descend && !m.is_empty() => Some(self.below(m.len())),
                Value::Array(a) if descend && !a.is_empty() => Some(self.below(a.len())),
                _ => None,
            };
            let Some(i) = next_index else { break };
            node = match node {
                Value::Object(m) => m.values_mut().nth(i).expect("index in range"),
                Value::Array(a) => &mut a[i],
                _ => unreachable!(),
            };
        }
        match node {
            Value::Object(m) if self.chance(2) => self.mutate_object(m, names),
            Value::Array(a) if self.chance(2) && !a.is_empty() => match self.below(3) {
                0 => {
                    let i = self.below(a.len());
                    a.remove(i);
                }
                1 => {
                    let i = self.below(a.len());
                    let copy = a[i].clone();
                    let n = self.range(1, 40);
                    a.extend(std::iter::repeat_n(copy, n));
                }
                _ => a.push(self.hostile_value()),
            },
            other => *other = self.hostile_value(),
        }
    }

    fn mutate_object(&mut self, m: &mut Map<String, Value>, names: &[&str]) {
        if !m.is_empty() && self.chance(2) {
            let i = self.below(m.len());
            let k = m.keys().nth(i).expect("index in range").clone();
            m.remove(&k);
        } else {
            let k = self.member(names);
            let v = self.hostile_value();
            m.insert(k, v);
        }
    }

    /// Replaces one leaf of `v` with a hostile value of the same JSON type (a number with a
    /// bound, zero or a huge one, a string with a long or odd one, a boolean flipped), so the
    /// mutant still decodes into its typed shape and its values reach the code behind it.
    pub fn mutate_json_typed(&mut self, v: &mut Value) {
        let mut node = v;
        loop {
            let next_index = match &*node {
                Value::Object(m) if !m.is_empty() => Some(self.below(m.len())),
                Value::Array(a) if !a.is_empty() => Some(self.below(a.len())),
                _ => None,
            };
            let Some(i) = next_index else { break };
            node = match node {
                Value::Object(m) => m.values_mut().nth(i).expect("index in range"),
                Value::Array(a) => &mut a[i],
                _ => unreachable!(),
            };
        }
        *node = match &*node {
            Value::Number(n) if n.is_u64() => {
                json!(*self.pick(&[
                    0,
                    1,
                    u64::MAX,
                    u64::MAX - 1,
                    u64::from(u32::MAX),
                    1 << 53,
                    n.as_u64().unwrap_or(0).saturating_add(1)
                ]))
            }
            Value::Number(_) => json!(*self.pick(&[0.0, -1.0, 1e300, f64::MIN_POSITIVE, -0.0])),
            Value::String(_) => Value::String(hostile_string(self)),
            Value::Bool(b) => Value::Bool(!b),
            other => other.clone(),
        };
    }

    /// One to a few JSON mutations.
    pub fn mutate_json(&mut self, v: &mut Value, names: &[&str]) {
        for _ in 0..self.range(1, 4) {
            self.mutate_json_once(v, names);
        }
    }

    /// The bytes of `v` mutated at the JSON level and, sometimes, then at the byte level.
    pub fn mutant_bytes(&mut self, v: &Value, names: &[&str]) -> Vec<u8> {
        let mut v = v.clone();
        self.mutate_json(&mut v, names);
        let mut bytes = serde_json::to_vec(&v).expect("values serialize");
        if self.chance(4) {
            self.mutate_bytes(&mut bytes, &[]);
        }
        bytes
    }
}
