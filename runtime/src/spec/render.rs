//! Placeholder rendering of command arguments: `{name}` is replaced, `{{`, `}}` and
//! `${...}` stay literal.

/// Placeholders every command may use besides the search parameters.
pub const BUILTIN_PLACEHOLDERS: &[&str] = &["seed", "trial_id", "rank"];

/// A command argument named a placeholder that has no value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown placeholder {{{name}}}")]
pub struct RenderError {
    /// The placeholder's name, without braces.
    pub name: String,
}

/// The `{name}` placeholders of one argument; `{{` and `}}` are literal braces.
pub fn placeholders(arg: &str) -> Vec<String> {
    let mut names = Vec::new();
    // Every lookup answers, so rendering cannot fail here.
    let _rendered = render_arg(arg, |name| {
        names.push(name.to_owned());
        Some(String::new())
    });
    names
}

/// Replaces each `{name}` in `arg` with `lookup(name)`; an unknown name is an error.
///
/// Only `{` + an identifier + `}` is a placeholder, so JSON and shell braces in a
/// command stay as they are (`${HOME}` too: a brace after `$` is the shell's);
/// `{{` and `}}` write a literal brace where one is needed before an identifier.
pub fn render_arg(
    arg: &str,
    mut lookup: impl FnMut(&str) -> Option<String>,
) -> Result<String, RenderError> {
    let mut out = String::with_capacity(arg.len());
    let mut rest = arg;
    while let Some(ch) = rest.chars().next() {
        if rest.starts_with("{{") || rest.starts_with("}}") {
            out.push(ch);
            rest = &rest[2..];
            continue;
        }
        if ch == '{' && !out.ends_with('$') {
            let body = &rest[1..];
            let name_len = body
                .char_indices()
                .find(|(idx, inner)| {
                    !(inner.is_ascii_alphabetic()
                        || *inner == '_'
                        || (*idx > 0 && inner.is_ascii_digit()))
                })
                .map_or(body.len(), |(idx, _)| idx);
            if name_len > 0 && body[name_len..].starts_with('}') {
                let name = &body[..name_len];
                let value = lookup(name).ok_or_else(|| RenderError {
                    name: name.to_owned(),
                })?;
                out.push_str(&value);
                rest = &body[name_len + 1..];
                continue;
            }
        }
        out.push(ch);
        rest = &rest[ch.len_utf8()..];
    }
    Ok(out)
}
