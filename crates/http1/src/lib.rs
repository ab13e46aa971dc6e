//! vigil-http1: the one HTTP/1 body codec of vigil. How a message's body
//! is framed, read from its head ([`Framed`], [`Framed::response`]), and
//! the body decoded from the bytes read ([`Decoder`]: Content-Length,
//! chunked, until the close), for the proxy's server loop (request
//! bodies), its upstream client (response bodies) and the checker's
//! probes. Heads are parsed by each reader (with `httparse`): what each
//! keeps of a head differs, how a body is framed does not.
//!
//! Chunked bodies are decoded by nginx's rules (`ngx_http_parse_chunked`,
//! which nginx uses for a client's request body and an upstream's
//! response alike): a bare LF ends a line, whitespace or `;` may follow
//! the size, and the trailer section is parsed as header fields.

#![forbid(unsafe_code)]
#![warn(missing_docs, unreachable_pub)]

mod decode;
mod framing;

pub use decode::{Decoded, Decoder, Premature};
pub use framing::{last_token_is_chunked, tokens_in, Framed, Framing, FramingError};
