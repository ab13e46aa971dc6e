//! The `$variables` in a directive's value, found as nginx finds them:
//! one scanner for the proxy's value templates (`proxy_set_header`,
//! `return`, `set`, ...), its access log formats, and the nginx.conf
//! front end's checks of a `log_format`.

/// A piece of a value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Piece<'a> {
    /// Text as it is (a `$` without a name in a template is text too:
    /// adjacent pieces of text are the caller's to join).
    Text(&'a str),
    /// A variable, by name (`$name` or `${name}`).
    Name(&'a str),
    /// A regex capture, `$1` to `$9` (templates only).
    Capture(usize),
}

/// Which of nginx's two variable syntaxes a value is written in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Syntax {
    /// `ngx_http_script_compile` (every value but a log format): `$1` to
    /// `$9` are captures, `${...}` names whatever is inside its braces,
    /// and a `$` without a name is text.
    Template,
    /// `ngx_http_log_compile_format`: a name is letters, digits and `_`,
    /// in braces or not; a `$` without one, or a `${name` without its
    /// `}`, is an error.
    LogFormat,
}

/// Why a value's variables cannot be read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ScanError {
    /// `${` without its `}`: the name read (a log format's), and the value
    /// from the brace on.
    Unclosed {
        /// The name after the brace.
        name: String,
        /// The value from the `{`.
        rest: String,
    },
    /// A `$` without a name (a log format's): the value from the `$`.
    NoName(String),
}

/// The pieces of `text`, in order.
pub fn scan(text: &str, syntax: Syntax) -> Result<Vec<Piece<'_>>, ScanError> {
    let b = text.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        if b[i] != b'$' {
            let start = i;
            while i < b.len() && b[i] != b'$' {
                i += 1;
            }
            out.push(Piece::Text(&text[start..i]));
            continue;
        }
        let dollar = i;
        i += 1;
        if syntax == Syntax::Template {
            if let Some(d @ b'1'..=b'9') = b.get(i).copied() {
                out.push(Piece::Capture(usize::from(d - b'0')));
                i += 1;
                continue;
            }
        }
        let bracket = b.get(i) == Some(&b'{');
        let (name, next) = match (bracket, syntax) {
            (true, Syntax::Template) => match text[i + 1..].find('}') {
                Some(end) => (&text[i + 1..i + 1 + end], i + end + 2),
                None => {
                    return Err(ScanError::Unclosed {
                        name: text[i + 1..].to_owned(),
                        rest: text[i..].to_owned(),
                    })
                }
            },
            _ => {
                let start = i + usize::from(bracket);
                let end = start
                    + b[start..]
                        .iter()
                        .take_while(|c| c.is_ascii_alphanumeric() || **c == b'_')
                        .count();
                let name = &text[start..end];
                if bracket && b.get(end) != Some(&b'}') {
                    return Err(ScanError::Unclosed {
                        name: name.to_owned(),
                        rest: text[i..].to_owned(),
                    });
                }
                (name, end + usize::from(bracket))
            }
        };
        if name.is_empty() {
            match syntax {
                Syntax::Template => out.push(Piece::Text("$")),
                Syntax::LogFormat => return Err(ScanError::NoName(text[dollar..].to_owned())),
            }
            continue;
        }
        out.push(Piece::Name(name));
        i = next;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use Piece::{Capture, Name, Text};

    #[test]
    fn templates_read_captures_braces_and_a_lone_dollar_as_nginx_scripts_do() {
        assert_eq!(
            scan("a $host${x-y}$1z $ ${}", Syntax::Template),
            Ok(vec![
                Text("a "),
                Name("host"),
                Name("x-y"),
                Capture(1),
                Text("z "),
                Text("$"),
                Text(" "),
                Text("$"),
                Text("{}"),
            ])
        );
        assert_eq!(
            scan("x ${host", Syntax::Template),
            Err(ScanError::Unclosed {
                name: "host".into(),
                rest: "{host".into()
            })
        );
    }

    #[test]
    fn log_formats_read_names_as_nginx_log_compile_format_does() {
        assert_eq!(
            scan("$remote_addr - ${status}x $1", Syntax::LogFormat),
            Ok(vec![
                Name("remote_addr"),
                Text(" - "),
                Name("status"),
                Text("x "),
                Name("1"),
            ])
        );
        assert_eq!(
            scan("a ${status x", Syntax::LogFormat),
            Err(ScanError::Unclosed {
                name: "status".into(),
                rest: "{status x".into()
            })
        );
        assert_eq!(
            scan("a $ b", Syntax::LogFormat),
            Err(ScanError::NoName("$ b".into()))
        );
    }
}
