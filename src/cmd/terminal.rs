//! User text made safe for a terminal: metric names, trial reasons, alert
//! messages, names and anything else a user, a worker or a node wrote, on its
//! way to stdout, stderr or `xp top`'s screen.
//!
//! A control character (C0, DEL, C1) could move the cursor, rewrite the
//! screen or the window title, or forge a line; a bidirectional formatting
//! character reorders what follows it. Each is written as a visible escape
//! instead: `\n`, `\r`, `\t`, else `\uXXXX` as JSON writes it, so a `--json`
//! line stays valid JSON that decodes to the same text.
//!
//! Invariant: every line the commands print goes through [`shown`] (`outln!`)
//! or [`shown_lines`] (`write_output`, notes on stderr), so no printer can
//! forget it; `xp top` passes user text through [`shown`] too. Not here: the
//! body of a worker's log (`xp logs`), which is the trial's own output,
//! printed as it wrote it, as `cat` would.

use std::borrow::Cow;
use std::fmt::Write;

/// `text` with every control character, newlines included, and every
/// bidirectional formatting character written as an escape: for one line, or
/// one cell of a table.
pub(crate) fn shown(text: &str) -> Cow<'_, str> {
    escaped(text, false)
}

/// Like [`shown`], but newlines stay: for text that is several lines by
/// design (a CSV trace, pretty JSON, a multi-line error).
pub(crate) fn shown_lines(text: &str) -> Cow<'_, str> {
    escaped(text, true)
}

fn escaped(text: &str, keep_newlines: bool) -> Cow<'_, str> {
    let unsafe_here = |ch: char| is_unsafe(ch) && !(keep_newlines && ch == '\n');
    if !text.chars().any(unsafe_here) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 16);
    for ch in text.chars() {
        match ch {
            ch if !unsafe_here(ch) => out.push(ch),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            ch => write!(out, "\\u{:04x}", u32::from(ch)).expect("writing to a String cannot fail"),
        }
    }
    Cow::Owned(out)
}

/// A control character (C0, DEL, C1), or a character that changes the
/// direction of the text after it.
fn is_unsafe(ch: char) -> bool {
    ch.is_control()
        || matches!(
            ch,
            '\u{061c}' | '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}'
        )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(text: &str, expected_line: &str, expected_lines: &str) {
        assert_eq!(shown(text), expected_line, "{text:?}");
        assert_eq!(shown_lines(text), expected_lines, "{text:?}");
    }

    #[test]
    fn control_characters_are_shown_as_escapes() {
        check("loss", "loss", "loss");
        check("val_acc é 漢字 ✓", "val_acc é 漢字 ✓", "val_acc é 漢字 ✓");
        check(
            "\u{1b}[2J\u{1b}]0;pwned\u{7}",
            "\\u001b[2J\\u001b]0;pwned\\u0007",
            "\\u001b[2J\\u001b]0;pwned\\u0007",
        );
        check("a\nfake line", "a\\nfake line", "a\nfake line");
        check("a\rb\tc\u{8}", "a\\rb\\tc\\u0008", "a\\rb\\tc\\u0008");
        check(
            "\u{7f}\u{9b}31m\u{85}",
            "\\u007f\\u009b31m\\u0085",
            "\\u007f\\u009b31m\\u0085",
        );
        check(
            "abc\u{202e}fed\u{2066}",
            "abc\\u202efed\\u2066",
            "abc\\u202efed\\u2066",
        );
        assert!(matches!(shown("plain"), Cow::Borrowed(_)));
    }

    #[test]
    fn a_json_line_stays_json_that_decodes_to_the_same_text() {
        let name = "m\u{1b}[31m\u{9b}\u{7f}\u{202e}\n\\\u{85}";
        let line = serde_json::json!({ name: 1.0, "reason": name }).to_string();
        let shown = shown(&line);
        assert!(!shown.chars().any(is_unsafe), "{shown}");
        let decoded: serde_json::Value = serde_json::from_str(&shown).unwrap();
        assert_eq!(decoded["reason"], name);
        assert_eq!(decoded[name], 1.0);
    }
}
