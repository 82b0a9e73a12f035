//! Part numbers (cortexkit-role-compaction A3, W4.6, W4.7) for a session that renders them.
//!
//! broca has no compaction markers and never rewrites history, so a part's number is its
//! position, counting from 1, among the numbered parts of the whole transcript (checkpoint 0).
//! Numbered: the non-empty text parts of user and assistant messages, and each tool call whose
//! result the transcript holds, at the call's position (the result's text carries the number).
//! A batch's results are the tool message right after the assistant message that asked (broca
//! writes them so), so a call is paired with its result by position, never by a tool call id
//! alone, which a model may reuse across turns.
//! Never numbered: reasoning, images, system text. A call without a result yet has no number,
//! and nothing follows it that one could shift, so a number, once shown, never changes.
//!
//! Shown: the request renders `§N§ ` in front of each numbered text and tool result. A model
//! reply's text is cleaned of tag notation (W4.6) when rendered back; what is stored keeps the
//! model's bytes.

use serde_json::json;
use std::borrow::Cow;

use crate::frozen::FrozenConfig;
use crate::message::{Message, Part, Role};

/// The part numbers of `history`: per message, per part, the number or `None`.
pub fn numbers(history: &[Message]) -> Vec<Vec<Option<u64>>> {
    let mut next = 0u64;
    history
        .iter()
        .enumerate()
        .map(|(i, m)| {
            m.content
                .iter()
                .map(|p| {
                    let numbered = match (m.role, p) {
                        (Role::User | Role::Assistant, Part::Text { text }) => !text.is_empty(),
                        (Role::Assistant, Part::ToolCall { tool_call_id, .. }) => {
                            result_of(history, i, tool_call_id).is_some()
                        }
                        _ => false,
                    };
                    numbered.then(|| {
                        next += 1;
                        next
                    })
                })
                .collect()
        })
        .collect()
}

/// The result of the call `id` of the assistant message `history[at]`: its part index in the
/// tool message right after, and the part.
pub fn result_of<'a>(history: &'a [Message], at: usize, id: &str) -> Option<(usize, &'a Part)> {
    result_in(history.get(at + 1), id)
}

/// The result of the call `id` in `next`, the message right after the one that asked for it,
/// if it is a tool message: its part index there, and the part.
pub fn result_in<'a>(next: Option<&'a Message>, id: &str) -> Option<(usize, &'a Part)> {
    let results = next.filter(|m| m.role == Role::Tool)?;
    results
        .content
        .iter()
        .enumerate()
        .find(|(_, p)| matches!(p, Part::ToolResult { tool_call_id, .. } if tool_call_id == id))
}

/// The transcript a request of `config` shows: `history` itself, or, for a session that
/// renders part numbers, `history` with the numbers rendered (see [`tagged`]).
pub fn shown<'a>(config: &FrozenConfig, history: &'a [Message]) -> Cow<'a, [Message]> {
    match config.renders_part_numbers() {
        true => Cow::Owned(tagged(history)),
        false => Cow::Borrowed(history),
    }
}

/// `history` with `§N§ ` in front of every numbered text and tool result, assistant text
/// cleaned of tag notation first.
pub fn tagged(history: &[Message]) -> Vec<Message> {
    let numbers = numbers(history);
    history
        .iter()
        .enumerate()
        .map(|(i, m)| {
            // A tool message's results take the numbers of the calls of the message before it.
            let asked = i.checked_sub(1).filter(|_| m.role == Role::Tool).map(|a| (&history[a], &numbers[a]));
            let call_number = |id: &str| {
                let (asker, ns) = asked?;
                asker.content.iter().zip(ns).find_map(|(p, n)| match p {
                    Part::ToolCall { tool_call_id, .. } if tool_call_id == id => *n,
                    _ => None,
                })
            };
            let content = m
                .content
                .iter()
                .zip(&numbers[i])
                .map(|(p, n)| match (p, n) {
                    (Part::Text { text }, Some(n)) => {
                        let text = match m.role {
                            Role::Assistant => clean_reply(text),
                            _ => Cow::Borrowed(text.as_str()),
                        };
                        Part::Text { text: format!("{}{text}", prefix(*n)) }
                    }
                    (Part::ToolResult { tool_call_id, output, is_error }, _) => match call_number(tool_call_id) {
                        Some(n) => {
                            let (text, is_error) = crate::provider::tool_output(output, *is_error);
                            let output = json!({"kind": "text", "text": format!("{}{text}", prefix(n))});
                            Part::ToolResult { tool_call_id: tool_call_id.clone(), output, is_error }
                        }
                        None => p.clone(),
                    },
                    _ => p.clone(),
                })
                .collect();
            Message {
                role: m.role,
                content,
                origin: m.origin.clone(),
                delivered_as: m.delivered_as.clone(),
                sender: m.sender.clone(),
                client_message_id: m.client_message_id.clone(),
            }
        })
        .collect()
}

/// The prefix a numbered part is rendered with (W4.7).
pub fn prefix(n: u64) -> String {
    format!("§{n}§ ")
}

/// A model reply's text cleaned of tag notation (W4.6), in order: the leading prefixes, every
/// well-formed `§N§`, the hybrids `§N">§M§`, `§N">§` and `§N">`, a dangling `§N` with at most
/// one non-word closer (never one followed by a digit or by `.` and a digit: `§5.1` stays),
/// any stray `§`, then surrounding whitespace. Text that would be left empty stays as it was.
pub fn clean_reply(text: &str) -> Cow<'_, str> {
    if !text.contains('§') {
        return Cow::Borrowed(text);
    }
    let mut rest = text;
    while let Some(after) = tag_at(rest).map(|len| &rest[len..]) {
        rest = after.trim_start();
    }
    let mut out = remove_all(rest, tag_at);
    out = remove_all(&out, hybrid_at);
    out = remove_all(&out, dangling_at);
    out = out.replace('§', "");
    let trimmed = out.trim();
    match trimmed.is_empty() {
        true => Cow::Borrowed(text),
        false => Cow::Owned(trimmed.to_owned()),
    }
}

/// `s` with every match removed, scanning left to right (a matcher answers the length of its
/// match at the start of its argument).
fn remove_all(s: &str, matcher: impl Fn(&str) -> Option<usize>) -> String {
    let mut out = String::with_capacity(s.len());
    let mut i = 0;
    while i < s.len() {
        if s[i..].starts_with('§') {
            if let Some(len) = matcher(&s[i..]) {
                i += len;
                continue;
            }
        }
        let c = s[i..].chars().next().unwrap_or_default();
        out.push(c);
        i += c.len_utf8().max(1);
    }
    out
}

/// The length of the ASCII digits at the start of `s`.
fn digits(s: &str) -> usize {
    s.bytes().take_while(u8::is_ascii_digit).count()
}

/// `§N§` at the start of `s`.
fn tag_at(s: &str) -> Option<usize> {
    let body = s.strip_prefix('§')?;
    let n = digits(body);
    (n > 0 && body[n..].starts_with('§')).then(|| 2 * '§'.len_utf8() + n)
}

/// `§N">§M§`, `§N">§` or `§N">` at the start of `s`, longest first.
fn hybrid_at(s: &str) -> Option<usize> {
    let body = s.strip_prefix('§')?;
    let n = digits(body);
    let after = body[n..].strip_prefix("\">").filter(|_| n > 0)?;
    let head = '§'.len_utf8() + n + 2;
    if let Some(len) = tag_at(after) {
        return Some(head + len);
    }
    match after.starts_with('§') {
        true => Some(head + '§'.len_utf8()),
        false => Some(head),
    }
}

/// A dangling `§N` with at most one non-word closer, unless a digit or `.digit` follows.
fn dangling_at(s: &str) -> Option<usize> {
    let body = s.strip_prefix('§')?;
    let n = digits(body);
    if n == 0 {
        return None;
    }
    let after = &body[n..];
    let mut chars = after.chars();
    let len = '§'.len_utf8() + n;
    match chars.next() {
        None => Some(len),
        Some('.') if chars.next().is_some_and(|c| c.is_ascii_digit()) => None,
        Some(c) if c.is_alphanumeric() || c == '_' || c.is_whitespace() => Some(len),
        Some(c) => Some(len + c.len_utf8()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(id: &str) -> Part {
        Part::ToolCall { tool_call_id: id.into(), tool_name: "read".into(), input: json!({}) }
    }

    fn result(id: &str, text: &str) -> Part {
        Part::ToolResult { tool_call_id: id.into(), output: json!({"kind": "text", "text": text}), is_error: false }
    }

    fn history() -> Vec<Message> {
        vec![
            Message::user_text("look"),
            Message::of(Role::Assistant, vec![Part::Text { text: "reading".into() }, call("a"), call("b")]),
            Message::of(Role::Tool, vec![result("a", "A"), result("b", "B")]),
            Message::of(Role::Assistant, vec![Part::Text { text: String::new() }, call("c")]),
        ]
    }

    #[test]
    fn numbers_count_texts_and_answered_calls_at_the_call_s_position() {
        let numbers = numbers(&history());
        assert_eq!(numbers, vec![vec![Some(1)], vec![Some(2), Some(3), Some(4)], vec![None, None], vec![None, None]]);
    }

    #[test]
    fn a_number_once_shown_never_changes_as_the_transcript_grows() {
        let mut h = history();
        let before = numbers(&h);
        h.push(Message::of(Role::Tool, vec![result("c", "C")]));
        h.push(Message::assistant_text("done"));
        let after = numbers(&h);
        assert_eq!(&after[..3], &before[..3]);
        assert_eq!(after[3], vec![None, Some(5)]);
        assert_eq!(after[5], vec![Some(6)]);
    }

    #[test]
    fn tagged_prefixes_texts_and_results_and_cleans_replies() {
        let mut h = history();
        h[1].content[0] = Part::Text { text: "§9§ reading §2§".into() };
        let t = tagged(&h);
        assert_eq!(t[0].content[0], Part::Text { text: "§1§ look".into() });
        assert_eq!(t[1].content[0], Part::Text { text: "§2§ reading".into() });
        assert_eq!(
            t[2].content[1],
            Part::ToolResult {
                tool_call_id: "b".into(),
                output: json!({"kind": "text", "text": "§4§ B"}),
                is_error: false
            }
        );
        assert_eq!(t[3], h[3], "an unanswered call and an empty text are shown as they are");
    }

    #[test]
    fn a_reused_call_id_is_paired_by_position() {
        let mut h = history();
        h.push(Message::of(Role::Tool, vec![result("c", "C")]));
        h.push(Message::of(Role::Assistant, vec![call("a")]));
        assert_eq!(numbers(&h)[5], vec![None], "the second `a` has no result yet");
        h.push(Message::of(Role::Tool, vec![result("a", "A2")]));
        assert_eq!(numbers(&h)[5], vec![Some(6)]);
        let t = tagged(&h);
        let shown = |m: &Message| match &m.content[0] {
            Part::ToolResult { output, .. } => output["text"].as_str().unwrap_or_default().to_owned(),
            other => panic!("{other:?}"),
        };
        assert_eq!((shown(&t[2]), shown(&t[6])), ("§3§ A".to_owned(), "§6§ A2".to_owned()));
    }

    #[test]
    fn cleaning_follows_w4_6() {
        for (raw, clean) in [
            ("§3§ hello", "hello"),
            ("§3§ §4§ hello §5§ there", "hello  there"),
            ("a §12\">§13§ b", "a  b"),
            ("a §12\"> b", "a  b"),
            ("see §7) now", "see  now"),
            ("see §5.1 now", "see 5.1 now"),
            ("x §42", "x"),
            ("stray § sign", "stray  sign"),
            ("§3§", "§3§"),
            ("plain", "plain"),
        ] {
            assert_eq!(clean_reply(raw), clean, "{raw:?}");
        }
    }
}
