//! HTTP/1 on the client's side of the wire: the server's connection loop
//! and its request reader and response writer (`h1/`), the request line
//! and field checks nginx makes (`request_check`), hop-by-hop fields
//! (`hop`), fields passed as they came (`raw_head`), the header names a
//! worker met (`names`), the body types every message carries (`payload`,
//! `request_body`) and a worker's spare maps (`spare`).

pub(crate) mod h1;
pub(crate) mod hop;
pub(crate) mod names;
pub(crate) mod payload;
pub(crate) mod raw_head;
pub(crate) mod request_body;
pub(crate) mod request_check;
pub(crate) mod spare;
