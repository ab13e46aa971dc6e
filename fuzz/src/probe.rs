//! `probe_response`: the checker's HTTP probe reading and judging a reply
//! (`vigil_checker::probe::judge_reply`, the code a real probe runs).

use vigil_core::config::{HttpCheck, StatusClass};

thread_local! {
    static RUNTIME: Option<tokio::runtime::Runtime> = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .ok();
}

/// Byte 0 picks how many bytes each read returns (1 to 256), byte 1 the
/// check (body match or not, `HEAD` or `GET`, which statuses pass); the
/// rest is the reply.
pub fn probe_response(data: &[u8]) {
    let [c, k, reply @ ..] = data else {
        return;
    };
    let chunk = usize::from(*c) + 1;
    let check = HttpCheck {
        send: if k & 1 == 0 {
            "GET / HTTP/1.0\r\n\r\n".into()
        } else {
            "HEAD / HTTP/1.0\r\n\r\n".into()
        },
        expect: match (k >> 1) % 3 {
            0 => vec![StatusClass::Class(2), StatusClass::Class(3)],
            1 => vec![StatusClass::Exact(204), StatusClass::Class(1)],
            _ => vec![StatusClass::Class(5), StatusClass::Class(4)],
        },
        body_contains: match (k >> 3) % 3 {
            0 => None,
            1 => Some("ok".into()),
            _ => Some(String::new()),
        },
    };
    RUNTIME.with(|rt| {
        if let Some(rt) = rt {
            let _ = rt.block_on(vigil_checker::probe::judge_reply(&check, reply, chunk));
        }
    });
}
