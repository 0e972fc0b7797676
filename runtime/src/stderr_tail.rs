//! The last lines of a worker's stderr, as a failed attempt's outcome keeps
//! them: at most [`MAX_TAIL_LINES`] lines and [`MAX_TAIL_BYTES`] bytes, with
//! what a terminal would not print as text made harmless.
//!
//! The node makes the tail from the raw bytes it kept of a failing worker's
//! stderr and sends it with the exit report; the head bounds it again with the
//! same function before putting it into the outcome, since a node's report is
//! not trusted to be small. [`tail_of`] is idempotent, so bounding twice
//! changes nothing.
//!
//! What is done to the text: invalid UTF-8 is replaced; a line keeps what
//! follows its last carriage return (what a terminal shows of a progress bar
//! redrawn with `\r`; a `\r\n` ending is an ending); ANSI colour and title
//! sequences are dropped; every other control character (C0 but the newline,
//! DEL, C1, and the bidirectional controls) is escaped as JSON writes it (`\t`,
//! `\u001b`); trailing blank lines go; then the last lines that fit are kept,
//! a line longer than the whole budget by its end, after `...`.
//!
//! Not here: keeping the raw bytes (the node's worker output pumps) and
//! where the tail is shown (the head puts it after the exit in the outcome).

/// The most lines a tail keeps.
pub const MAX_TAIL_LINES: usize = 20;
/// The most bytes a tail keeps (its lines joined by `\n`).
pub const MAX_TAIL_BYTES: usize = 4096;
/// How many raw bytes of stderr a node keeps per worker to make a tail from:
/// enough for [`MAX_TAIL_LINES`] lines of ordinary length after escaping.
pub const RAW_TAIL_BYTES: usize = 4 * MAX_TAIL_BYTES;

/// What marks a line cut at its start.
const CUT: &str = "...";

/// The tail of `raw` (the end of a stream of bytes, possibly cut in the
/// middle of a character), bounded and escaped as the module says; empty when
/// nothing but blank lines remains.
pub fn tail_of(raw: &[u8]) -> String {
    // A tail cut inside a character starts with its continuation bytes.
    let start = raw
        .iter()
        .position(|byte| !(0x80..0xC0).contains(byte))
        .unwrap_or(raw.len())
        .min(3);
    let text = String::from_utf8_lossy(&raw[start..]);
    let mut lines: Vec<String> = text.split('\n').map(clean_line).collect();
    while lines.last().is_some_and(|line| line.trim().is_empty()) {
        lines.pop();
    }
    let first = lines.len().saturating_sub(MAX_TAIL_LINES);
    let mut kept: Vec<String> = lines.split_off(first);
    while kept.len() > 1 && joined_len(&kept) > MAX_TAIL_BYTES {
        kept.remove(0);
    }
    if let [only] = kept.as_mut_slice()
        && only.len() > MAX_TAIL_BYTES
    {
        *only = end_of(only, MAX_TAIL_BYTES - CUT.len());
    }
    kept.join("\n")
}

/// The length of `lines` joined by newlines.
fn joined_len(lines: &[String]) -> usize {
    lines.iter().map(String::len).sum::<usize>() + lines.len().saturating_sub(1)
}

/// `line`'s last `budget` bytes or fewer, at a character boundary, after [`CUT`].
fn end_of(line: &str, budget: usize) -> String {
    let mut from = line.len() - budget;
    while !line.is_char_boundary(from) {
        from += 1;
    }
    format!("{CUT}{}", &line[from..])
}

/// One line as a terminal would show it, with its controls escaped.
fn clean_line(line: &str) -> String {
    let line = line.trim_end_matches('\r');
    let shown = line.rsplit('\r').next().unwrap_or(line);
    let mut clean = String::with_capacity(shown.len());
    let mut chars = shown.chars().peekable();
    while let Some(character) = chars.next() {
        if character == '\u{1b}' && skip_sequence(&mut chars) {
            continue;
        }
        if is_control(character) {
            escape(&mut clean, character);
        } else {
            clean.push(character);
        }
    }
    clean
}

/// Skips the rest of an escape sequence whose ESC was just read, if it is a
/// CSI (`ESC [` parameters, intermediates, a final byte: colours, cursor moves)
/// or an OSC (`ESC ]` up to BEL or `ESC \`: window titles, links); returns
/// whether it did.
fn skip_sequence(chars: &mut std::iter::Peekable<std::str::Chars<'_>>) -> bool {
    match chars.peek() {
        Some('[') => {
            chars.next();
            for character in chars.by_ref() {
                if ('\u{40}'..='\u{7e}').contains(&character) {
                    break;
                }
                if !('\u{20}'..='\u{3f}').contains(&character) {
                    break;
                }
            }
            true
        }
        Some(']') => {
            chars.next();
            while let Some(character) = chars.next() {
                if character == '\u{7}' {
                    break;
                }
                if character == '\u{1b}' && chars.peek() == Some(&'\\') {
                    chars.next();
                    break;
                }
            }
            true
        }
        _ => false,
    }
}

/// Whether `character` must not reach a terminal or a one-line view as it is.
fn is_control(character: char) -> bool {
    character.is_control()
        || matches!(
            character,
            '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}'
        )
}

/// Appends `character` as JSON writes it: `\t`, `\r`, else `\uXXXX`.
fn escape(out: &mut String, character: char) {
    use std::fmt::Write;
    match character {
        '\t' => out.push_str("\\t"),
        '\r' => out.push_str("\\r"),
        other => {
            let _ = write!(out, "\\u{:04x}", u32::from(other));
        }
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn check(raw: &str, expected: &str) {
        assert_eq!(tail_of(raw.as_bytes()), expected, "tail of {raw:?}");
    }

    #[test]
    fn a_tail_reads_as_a_terminal_shows_it() {
        check("", "");
        check("\n\n  \n", "");
        check(
            "Traceback:\n  oops\nValueError: x\n",
            "Traceback:\n  oops\nValueError: x",
        );
        check("windows\r\nline\r\n", "windows\nline");
        check(
            " 10%|#\r 50%|#####\r100%|##########\nbad\n",
            "100%|##########\nbad",
        );
        check(
            "\u{1b}[31mred\u{1b}[0m and \u{1b}]0;title\u{7}plain",
            "red and plain",
        );
        check(
            "tab\there\u{1b}(B\u{7f}\u{85}",
            "tab\\there\\u001b(B\\u007f\\u0085",
        );
        check("a\u{202e}b\u{2066}c", "a\\u202eb\\u2066c");
    }

    #[test]
    fn a_tail_keeps_the_last_lines_within_its_bounds() {
        let many: String = (1..=30).map(|i| format!("line {i}\n")).collect();
        let expected: Vec<String> = (11..=30).map(|i| format!("line {i}")).collect();
        check(&many, &expected.join("\n"));
        let wide = format!("{}\n{}\nend", "a".repeat(3000), "b".repeat(3000));
        check(&wide, &format!("{}\nend", "b".repeat(3000)));
        let huge = format!("{}é{}", "x".repeat(5000), "y".repeat(4092));
        let tail = tail_of(huge.as_bytes());
        assert!(tail.len() <= MAX_TAIL_BYTES, "{}", tail.len());
        assert!(tail.starts_with("...y"), "{tail}");
    }

    #[test]
    fn a_tail_cut_inside_a_character_starts_at_the_next_one() {
        let raw = "é and more".as_bytes();
        assert_eq!(tail_of(&raw[1..]), " and more");
        assert_eq!(tail_of(&[0xff, b'o', b'k']), "\u{fffd}ok");
    }

    proptest! {
        #[test]
        fn any_tail_is_bounded_clean_and_stable(raw in proptest::collection::vec(any::<u8>(), 0..12_000)) {
            let tail = tail_of(&raw);
            prop_assert!(tail.len() <= MAX_TAIL_BYTES);
            prop_assert!(tail.split('\n').count() <= MAX_TAIL_LINES);
            prop_assert!(!tail.chars().any(|character| character != '\n' && is_control(character)));
            prop_assert_eq!(tail_of(tail.as_bytes()), tail.clone());
        }
    }
}
