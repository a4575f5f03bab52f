//! Glob patterns over ids (`*` any run of characters, `?` exactly one), matched in time linear
//! in the text: event filters and webhook filters match fence ids with them, fence scopes match
//! device ids, and both the patterns and the ids can come from clients.
//!
//! A backtracking matcher costs up to (text length x pattern length) per id: a poll of 200,000
//! events with `fence=*aaaa...ab` against a 256-character id took seconds of CPU. This one runs
//! the pattern as a set of states (one bit per pattern position, Thompson's construction done
//! bit-parallel), so each character of the text costs one step over `ceil((pattern + 1) / 64)`
//! machine words, whatever the pattern.
//!
//! Invariant: [`Glob::matches`] agrees with a plain recursive glob matcher on every input (a
//! property test checks it against the `wildmatch` crate).

use std::collections::HashMap;

/// A compiled glob pattern.
#[derive(Debug, Clone)]
pub struct Glob {
    /// The pattern with runs of `*` collapsed into one.
    states: usize,
    form: Form,
}

#[derive(Debug, Clone)]
enum Form {
    /// No wildcard: the text must equal it.
    Exact(String),
    /// States as bit sets of `words` words.
    Bits(Bits),
}

#[derive(Debug, Clone)]
struct Bits {
    words: usize,
    /// Positions holding `*`.
    star: Vec<u64>,
    /// Positions holding `?`.
    any: Vec<u64>,
    /// Per ASCII character, its positions (empty when it appears nowhere).
    ascii: Vec<Vec<u64>>,
    /// Per other character, its positions.
    other: HashMap<char, Vec<u64>>,
}

impl Glob {
    /// Compiles `pattern`.
    pub fn new(pattern: &str) -> Glob {
        let mut chars: Vec<char> = Vec::with_capacity(pattern.len());
        for c in pattern.chars() {
            if !(c == '*' && chars.last() == Some(&'*')) {
                chars.push(c);
            }
        }
        let states = chars.len() + 1;
        if !chars.iter().any(|&c| c == '*' || c == '?') {
            return Glob {
                states,
                form: Form::Exact(pattern.to_string()),
            };
        }
        let words = states.div_ceil(64);
        let zero = vec![0u64; words];
        let mut bits = Bits {
            words,
            star: zero.clone(),
            any: zero.clone(),
            ascii: vec![Vec::new(); 128],
            other: HashMap::new(),
        };
        for (i, &c) in chars.iter().enumerate() {
            let set = match c {
                '*' => &mut bits.star,
                '?' => &mut bits.any,
                c if c.is_ascii() => {
                    let m = &mut bits.ascii[c as usize];
                    if m.is_empty() {
                        *m = zero.clone();
                    }
                    m
                }
                c => bits.other.entry(c).or_insert_with(|| zero.clone()),
            };
            set[i / 64] |= 1 << (i % 64);
        }
        Glob {
            states,
            form: Form::Bits(bits),
        }
    }

    /// Whether `text` matches the whole pattern.
    pub fn matches(&self, text: &str) -> bool {
        match &self.form {
            Form::Exact(p) => p == text,
            Form::Bits(b) => b.run(text, self.states - 1),
        }
    }
}

impl Bits {
    fn run(&self, text: &str, accept: usize) -> bool {
        let w = self.words;
        let mut cur = vec![0u64; w];
        let mut next = vec![0u64; w];
        cur[0] = 1;
        self.close(&mut cur);
        for c in text.chars() {
            let lit = if c.is_ascii() {
                Some(&self.ascii[c as usize]).filter(|m| !m.is_empty())
            } else {
                self.other.get(&c)
            };
            let mut carry = 0u64;
            let mut any_left = 0u64;
            for k in 0..w {
                let step = cur[k] & (self.any[k] | lit.map_or(0, |m| m[k]));
                // Shift the whole set one position up, across words.
                next[k] = (cur[k] & self.star[k]) | (step << 1) | carry;
                carry = step >> 63;
                any_left |= next[k];
            }
            if any_left == 0 {
                return false;
            }
            self.close(&mut next);
            std::mem::swap(&mut cur, &mut next);
        }
        cur[accept / 64] & (1 << (accept % 64)) != 0
    }

    /// Adds the states a `*` reaches by matching nothing (runs of `*` are collapsed, so one
    /// step is enough).
    fn close(&self, set: &mut [u64]) {
        let mut carry = 0u64;
        for (word, star) in set.iter_mut().zip(&self.star) {
            let from = *word & star;
            *word |= (from << 1) | carry;
            carry = from >> 63;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn stars_and_question_marks() {
        let cases = [
            ("depot-*", "depot-3", true),
            ("depot-*", "depot-", true),
            ("depot-*", "depot", false),
            ("yard-?", "yard-7", true),
            ("yard-?", "yard-17", false),
            ("*", "", true),
            ("", "", true),
            ("", "a", false),
            ("a**b", "ab", true),
            ("*a*b*c*", "xaybzc", true),
            ("*a*b*c*", "xaybz", false),
            ("h?q", "h\u{e9}q", true),
            ("caf\u{e9}-*", "caf\u{e9}-1", true),
            ("exact", "exact", true),
            ("exact", "exacT", false),
        ];
        for (p, t, want) in cases {
            assert_eq!(Glob::new(p).matches(t), want, "{p:?} ~ {t:?}");
        }
    }

    #[test]
    fn long_patterns_span_several_words() {
        let id = "a".repeat(256);
        let p = format!("*{}b", "a".repeat(128));
        assert!(!Glob::new(&p).matches(&id));
        let p = format!("*{}", "a".repeat(200));
        assert!(Glob::new(&p).matches(&id));
        let p = format!("{}*{}", "?".repeat(70), "a".repeat(70));
        assert!(Glob::new(&p).matches(&id));
        assert!(!Glob::new(&p).matches(&id[..139]));
    }

    proptest! {
        #[test]
        fn agrees_with_a_backtracking_matcher(
            p in "[ab*?\u{e9}]{0,80}",
            t in "[ab\u{e9}]{0,80}",
        ) {
            let want = wildmatch::WildMatch::new(&p).matches(&t);
            prop_assert_eq!(Glob::new(&p).matches(&t), want, "{:?} ~ {:?}", p, t);
        }
    }
}
