use bytes::Bytes;
use hyper::body::Frame;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;

use super::*;
use crate::wire::payload::BoxError;

const TIMERS: UpstreamTimers = UpstreamTimers {
    send: Duration::from_secs(60),
    read: Duration::from_secs(60),
};

/// A connection to `peer`'s other end with a POST of `body` written.
fn post(body: &UpBody) -> (H1, Written, UnixStream) {
    let (ours, peer) = UnixStream::pair().expect("socket pair");
    let mut h1 = H1::new(Stream::Unix(ours));
    let mut fields = http::HeaderMap::new();
    fields.insert(http::header::HOST, http::HeaderValue::from_static("u"));
    let written = h1.head_out().write(&Method::POST, "/up", &mut fields, body);
    (h1, written, peer)
}

/// A body whose pieces the test sends, ended when the sender is dropped.
fn streamed() -> (tokio::sync::mpsc::UnboundedSender<Bytes>, UpBody) {
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel::<Bytes>();
    let rx = std::sync::Arc::new(tokio::sync::Mutex::new(rx));
    let frames = futures_util::stream::unfold(rx, |rx| async move {
        let next = rx.lock().await.recv().await;
        next.map(|b| (Ok::<_, BoxError>(Frame::data(b)), rx))
    });
    let body = http_body_util::BodyExt::boxed(http_body_util::StreamBody::new(frames));
    (tx, body)
}

/// Read from `peer` until `buf` ends with `want` (the test's own bound).
async fn read_to(peer: &mut UnixStream, buf: &mut Vec<u8>, want: &[u8]) {
    let mut chunk = [0u8; 8192];
    while !buf.ends_with(want) {
        let n = tokio::time::timeout(Duration::from_secs(5), peer.read(&mut chunk))
            .await
            .expect("in time")
            .expect("read");
        assert!(n > 0, "closed before {:?}", String::from_utf8_lossy(want));
        buf.extend_from_slice(&chunk[..n]);
    }
}

/// The next data of `body` (None at its end).
async fn data(body: &mut RespBody) -> Option<Bytes> {
    loop {
        let frame = std::future::poll_fn(|cx| Pin::new(&mut *body).poll_frame(cx)).await?;
        if let Ok(d) = frame.expect("body").into_data() {
            return Some(d);
        }
    }
}

#[tokio::test]
async fn an_answer_while_a_write_waits_for_the_peer_is_the_response() {
    // More than the socket pair holds, and a peer that reads none of it.
    let body = crate::wire::payload::full(vec![b'x'; 8 << 20]);
    let (h1, written, mut peer) = post(&body);
    let names = Names::default();
    let send = h1.send(written, body, TIMERS, &names, false);
    tokio::pin!(send);
    assert!(
        futures_util::poll!(send.as_mut()).is_pending(),
        "the write waits for the peer"
    );
    peer.write_all(b"HTTP/1.1 413 Too Large\r\nContent-Length: 3\r\n\r\nbig")
        .await
        .expect("answer");
    let received = tokio::time::timeout(Duration::from_secs(5), send)
        .await
        .expect("the answer, while the body waits")
        .expect("a response");
    let mut resp = received.response;
    assert_eq!(resp.status(), 413);
    assert_eq!(data(resp.body_mut()).await.as_deref(), Some(&b"big"[..]));
    assert_eq!(data(resp.body_mut()).await, None);
    assert!(
        resp.body_mut().reclaim().is_none(),
        "a connection with the body half sent is not kept"
    );
}

#[tokio::test]
async fn a_body_the_peer_answered_goes_on_while_the_response_is_read() {
    let (tx, body) = streamed();
    let (h1, written, mut peer) = post(&body);
    let names = Names::default();
    let send = h1.send(written, body, TIMERS, &names, false);
    tokio::pin!(send);
    assert!(futures_util::poll!(send.as_mut()).is_pending());
    let mut got = Vec::new();
    read_to(&mut peer, &mut got, b"\r\n\r\n").await;
    assert!(
        String::from_utf8_lossy(&got).contains("Transfer-Encoding: chunked"),
        "{}",
        String::from_utf8_lossy(&got)
    );
    // The answer starts before any of the body came.
    peer.write_all(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        .await
        .expect("answer");
    let received = tokio::time::timeout(Duration::from_secs(5), send)
        .await
        .expect("in time")
        .expect("a response");
    let mut resp = received.response;
    assert_eq!(resp.status(), 200);
    for piece in ["abc", "defg"] {
        tx.send(Bytes::from(piece)).expect("send");
        // Reading the response sends the piece on; the peer echoes it.
        let reading = data(resp.body_mut());
        tokio::pin!(reading);
        assert!(futures_util::poll!(reading.as_mut()).is_pending());
        let chunk = format!("{:X}\r\n{piece}\r\n", piece.len());
        got.clear();
        read_to(&mut peer, &mut got, chunk.as_bytes()).await;
        assert_eq!(got, chunk.as_bytes());
        peer.write_all(chunk.as_bytes()).await.expect("echo");
        let echoed = tokio::time::timeout(Duration::from_secs(5), reading.as_mut())
            .await
            .expect("in time");
        assert_eq!(echoed.as_deref(), Some(piece.as_bytes()));
    }
    // The body ends: its last chunk goes, then the response ends, and the
    // connection, all of whose request went, may be kept.
    drop(tx);
    {
        let reading = data(resp.body_mut());
        tokio::pin!(reading);
        assert!(futures_util::poll!(reading.as_mut()).is_pending());
        got.clear();
        read_to(&mut peer, &mut got, b"0\r\n\r\n").await;
        assert_eq!(got, b"0\r\n\r\n");
        peer.write_all(b"0\r\n\r\n").await.expect("end");
        assert_eq!(reading.await, None);
    }
    assert!(resp.body_mut().reclaim().is_some());
}

#[tokio::test]
async fn a_response_that_ends_first_drops_the_rest_of_the_body() {
    let (tx, body) = streamed();
    let (h1, written, mut peer) = post(&body);
    let names = Names::default();
    let send = h1.send(written, body, TIMERS, &names, false);
    tokio::pin!(send);
    assert!(futures_util::poll!(send.as_mut()).is_pending());
    let mut got = Vec::new();
    read_to(&mut peer, &mut got, b"\r\n\r\n").await;
    peer.write_all(b"HTTP/1.1 401 Unauthorized\r\nContent-Length: 0\r\n\r\n")
        .await
        .expect("answer");
    let mut resp = tokio::time::timeout(Duration::from_secs(5), send)
        .await
        .expect("in time")
        .expect("a response")
        .response;
    assert_eq!(resp.status(), 401);
    assert!(resp.body().is_end_stream());
    assert!(
        resp.body_mut().reclaim().is_none(),
        "the request did not all go"
    );
    drop(resp);
    // Nothing more goes: the connection is closed.
    let _ = tx.send(Bytes::from_static(b"late"));
    got.clear();
    let n = tokio::time::timeout(Duration::from_secs(5), peer.read_to_end(&mut got))
        .await
        .expect("closed in time")
        .expect("read");
    assert_eq!((n, got), (0, Vec::new()));
}
