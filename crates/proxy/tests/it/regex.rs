//! nginx's regular expressions as PCRE reads them, each conf served by
//! vigil and by a stock nginx: `$` before a final newline in a location,
//! a `rewrite`, a `map`; the PCRE constructs of
//! crates/config/src/pattern/tests.rs's table through `map` keys;
//! `server_name` regexes and their groups; a runaway match.

use crate::locations::{get, same, same_uris};
use crate::twin::Twin;

#[tokio::test]
async fn a_location_regex_takes_a_uri_ending_in_a_newline_as_nginx() {
    // The security review's case: `^/adm2$` must hold `/adm2%0a` too, or
    // it falls through to `location /` and is proxied.
    let t = Twin::start(
        r#"upstream u0 { server {B0}; }
         server { listen {LISTEN};
           location ~ ^/adm2$ { return 403; }
           location ~ ^/adm3$ { deny all; proxy_pass http://u0; }
           location ~* ^/ADM4$ { return 403; }
           location / { proxy_pass http://u0; }
         }"#,
        1,
    )
    .await;
    let answers = same(
        &t,
        &[
            "/adm2",
            "/adm2%0a",
            "/adm2%0A",
            "/adm3%0a",
            "/Adm4%0a",
            "/adm2%0a%0a",
            "/adm2%0ax",
            "/adm2%0d%0a",
            "/adm2%0d",
        ],
    )
    .await;
    let status: Vec<u16> = answers.iter().map(|(v, _)| v.status).collect();
    assert_eq!(status, [403, 403, 403, 403, 403, 200, 200, 200, 200]);
    same_uris(&t);
    // Only what no regex took reached a backend.
    let (v, _) = t.uris();
    assert_eq!(v, [["/adm2%0a%0a", "/adm2%0ax", "/adm2%0d%0a", "/adm2%0d"]]);
}

#[tokio::test]
async fn rewrite_regexes_and_named_groups_as_nginx() {
    let t = Twin::start(
        r#"upstream u0 { server {B0}; }
         server { listen {LISTEN};
           set $a stale;
           location /r/ { rewrite ^/r/adm2$ /denied last; proxy_pass http://u0; }
           location = /denied { return 403; }
           location /c/ { rewrite ^/c/(\w*)$ /seen/$1 last; return 200 "no"; }
           location /seen/ { return 200 "[$uri]"; }
           location /rn/ { set $b stale; rewrite ^/rn/(?<b>q)?z$ /seen/b=$b last; }
           location ~ ^/opt/(?<a>x)?y$ { return 200 "[$a]"; }
           location /la/ { rewrite "^/la/(?!admin)(.*)$" /seen/$1 last; return 200 "kept"; }
           location /br/ { rewrite "^/br/(\w+)-\1$" /seen/twice-$1 last; return 200 "once"; }
         }"#,
        1,
    )
    .await;
    let answers = same(
        &t,
        &[
            "/r/adm2",
            "/r/adm2%0a",
            "/r/adm2%0a%0a",
            "/c/ab%0a",
            "/c/ab%0a%0a",
            "/rn/z",
            "/rn/qz",
            "/opt/y",
            "/opt/xy",
            "/la/admin/x",
            "/la/user/x",
            "/br/ab-ab",
            "/br/ab-ac",
        ],
    )
    .await;
    let bodies: Vec<String> = answers
        .iter()
        .map(|(v, _)| format!("{} {}", v.status, String::from_utf8_lossy(&v.body)))
        .collect();
    // `$` before the newline; the group stops before it; a named group that
    // took no part is "" (not the value `set` gave); look-ahead; a backreference.
    assert_eq!(bodies[1].split(' ').next(), Some("403"));
    assert_eq!(bodies[3], "200 [/seen/ab]");
    assert_eq!(bodies[4], "200 no");
    assert_eq!(bodies[5], "200 [/seen/b=]");
    assert_eq!(bodies[7], "200 []");
    assert_eq!(bodies[9], "200 kept");
    assert_eq!(bodies[10], "200 [/seen/user/x]");
    assert_eq!(bodies[11], "200 [/seen/twice-ab]");
    same_uris(&t);
    let (v, _) = t.uris();
    assert_eq!(v, [["/r/adm2%0a%0a"]]);
}

/// Map keys: `(key, value)`; the value shows the groups where the row is
/// about them.
const MAP_ROWS: &[(&str, &str)] = &[
    (r"~^/adm2$", "+"),
    (r"~^/adm2\z", "+"),
    (r"~^/adm2\Z", "+"),
    (r"~^/a.b$", "+"),
    (r"~(?s)^/a.b$", "+"),
    (r"~^/.$", "+"),
    (r"~^/\w+$", "+"),
    (r"~^/\W\W$", "+"),
    (r"~^/\d$", "+"),
    (r"~^/\s$", "+"),
    (r"~^/[[:alpha:]]+$", "+"),
    (r"~*^/CAFE$", "+"),
    (r"~*^/CAFÉ$", "+"),
    (r"~^/(?i)cafe$", "+"),
    (r"~*^/(?-i)cafe$", "+"),
    (r"~^/(?<a>x)(y)(?P<b>z)(?'c'w)$", "+[$1|$2|$3|$4]"),
    (r"~^/(a)?(b)$", "+[$1|$2]"),
    (r"~^/(?|(a)|(b))(c)$", "+[$1|$2]"),
    (r"~^/(?:(a)|b)+$", "+[$1]"),
    (r"~^/(.*)$", "+[$1]"),
    (r"~^/(?!admin)", "+"),
    (r"~(?<=\.)php$", "+"),
    (r"~(?<!\.)php$", "+"),
    (r"~^/(\w+)/\1$", "+[$1]"),
    (r"~^/(?<n>\w+)/\k<n>$", "+[$1]"),
    (r"~^/(?>a+)a", "+"),
    (r"~^/a++a", "+"),
    (r"~^/a+a", "+"),
    (r"~^/x/\Kyz", "+"),
    (r"~^/\Q.a*\E$", "+"),
    (r"~^/(a)?(?(1)b|c)$", "+[$1]"),
    (r"~^/(\((?:[^()]|(?1))*\))$", "+[$1]"),
];

#[tokio::test]
async fn map_regexes_mean_what_nginxs_pcre_means() {
    let mut conf = String::new();
    let mut values = Vec::new();
    for (i, (key, value)) in MAP_ROWS.iter().enumerate() {
        conf.push_str(&format!(
            "map $uri $m{i} {{ default -; \"{}\" \"{value}\"; }}\n",
            key.replace('\\', "\\\\")
        ));
        values.push(format!("$m{i}"));
    }
    conf.push_str(&format!(
        "server {{ listen {{LISTEN}}; location / {{ return 200 \"{}\"; }} }}",
        values.join(" ")
    ));
    let t = Twin::start(&conf, 0).await;
    let mut answers = Vec::new();
    for target in [
        "/adm2",
        "/adm2%0a",
        "/adm2%0a%0a",
        "/adm2%0ax",
        "/adm2%0d%0a",
        "/a%0ab",
        "/a%0db",
        "/%C3%A9",
        "/%D9%A3",
        "/%C2%A0",
        "/%0b",
        "/7",
        "/aZ",
        "/cafe",
        "/CAFE",
        "/caf%C3%89",
        "/CAF%C3%A9",
        "/xyzw",
        "/b",
        "/bc",
        "/ab",
        "/admin/x",
        "/public",
        "/a.php",
        "/ab/ab",
        "/ab/ac",
        "/aaa",
        "/x/yz",
        "/.a*",
        "/xa",
        "/c",
        "/ac",
        "/(a(b))",
        "/(a(b)",
    ] {
        let (v, n) = t.send(&get(target, "h.test")).await;
        let (vb, nb) = (
            String::from_utf8_lossy(&v.body),
            String::from_utf8_lossy(&n.body),
        );
        assert_eq!(
            (v.status, &vb),
            (n.status, &nb),
            "{target}: vigil then nginx, one value per row of MAP_ROWS\n{}",
            t.stock.error_log()
        );
        answers.push((target, vb.into_owned()));
    }
    // The rows are not all "-": each case the table is about shows.
    let row = |target: &str, i: usize| {
        let (_, body) = answers.iter().find(|(t, _)| *t == target).expect("sent");
        body.split(' ').nth(i).unwrap_or_default().to_string()
    };
    assert_eq!(row("/adm2%0a", 0), "+", "`$` before a final newline");
    assert_eq!(row("/adm2%0a", 1), "-", "`\\z`");
    assert_eq!(row("/adm2%0a%0a", 0), "-");
    assert_eq!(row("/xyzw", 15), "+[x|y|z|w]");
    assert_eq!(row("/b", 16), "+[|b]");
    assert_eq!(row("/bc", 17), "+[b|c]");
    assert_eq!(row("/public", 20), "+");
    assert_eq!(row("/admin/x", 20), "-");
    assert_eq!(row("/(a(b))", 31), "+[(a(b))]");
}

#[tokio::test]
async fn server_name_regexes_pick_the_block_as_nginx() {
    let t = Twin::start(
        r#"server { listen {LISTEN}; return 200 "default"; }
         server { listen {LISTEN}; server_name "~^(?!www\.)[a-z]+\.look\.test$"; return 200 "look"; }
         server { listen {LISTEN}; server_name ~^CI\.test$; return 200 "caseless"; }
         server { listen {LISTEN}; server_name ~^exact\.test$; return 200 "exact"; }
         server { listen {LISTEN};
           server_name "~^(?<sub>[a-z]+)\.cap\.test$" "~^(www\.)?(alt)\.test$";
           location / { return 200 "cap [$sub][$1][$2]"; }
           location ~ ^/loc/(\w+)$ { return 200 "loc [$sub][$1][$2]"; }
         }"#,
        0,
    )
    .await;
    let mut bodies = Vec::new();
    for host in [
        "api.look.test",
        "www.look.test",
        "ci.test",
        "CI.TEST",
        "exact.test",
        "EXACT.test",
        "exact.test.",
        "other.test",
        "api.cap.test",
        "www.alt.test",
        "alt.test",
    ] {
        let (v, n) = t.send(&get("/", host)).await;
        assert_eq!(
            (v.status, String::from_utf8_lossy(&v.body)),
            (n.status, String::from_utf8_lossy(&n.body)),
            "{host}"
        );
        bodies.push(String::from_utf8_lossy(&v.body).into_owned());
    }
    assert_eq!(
        bodies,
        [
            "look",
            "default",
            "caseless",
            "caseless",
            "exact",
            "exact",
            "exact",
            "default",
            "cap [api][api][]",
            "cap [][www.][alt]",
            "cap [][][alt]",
        ]
    );
    // A location regex's groups replace the host's; its named ones stay.
    let (v, n) = t.send(&get("/loc/word", "api.cap.test")).await;
    assert_eq!((v.status, &v.body), (n.status, &n.body));
    assert_eq!(String::from_utf8_lossy(&v.body), "loc [api][word][]");
}

#[tokio::test]
async fn the_only_block_of_an_address_still_sets_its_server_name_groups() {
    // ngx_http_optimize_servers looks the names of a lone block up when a
    // regex of them has groups, so that they are set.
    let t = Twin::start(
        r#"server { listen {LISTEN}; server_name "~^(www\.)?(?<site>[a-z]+)\.one\.test$";
             location / { return 200 "[$1][$2][$site]"; }
             location /go/ { return 301 https://$site.example$request_uri; }
           }"#,
        0,
    )
    .await;
    let mut bodies = Vec::new();
    for (target, host) in [
        ("/", "www.a.one.test"),
        ("/", "b.one.test"),
        ("/", "other.test"),
    ] {
        let (v, n) = t.send(&get(target, host)).await;
        assert_eq!((v.status, &v.body), (n.status, &n.body), "{host}");
        bodies.push(String::from_utf8_lossy(&v.body).into_owned());
    }
    assert_eq!(bodies, ["[www.][a][a]", "[][b][b]", "[][][]"]);
    let (v, n) = t.send(&get("/go/x?q=1", "b.one.test")).await;
    assert_eq!(
        (v.status, v.header("location")),
        (n.status, n.header("location"))
    );
    assert_eq!(v.header("location"), "https://b.example/go/x?q=1");
}

#[tokio::test]
async fn a_runaway_regex_answers_500_and_never_falls_through() {
    // Exponential backtracking reaches PCRE2's match limit (10,000,000) in
    // both: nginx's find-config phase fails with 500; a `deny` there must
    // not become `location /`.
    let t = Twin::start(
        r#"upstream u0 { server {B0}; }
         server { listen {LISTEN};
           location ~ ^/(a|aa)+$ { return 403; }
           location / { proxy_pass http://u0; }
         }"#,
        1,
    )
    .await;
    let runaway = format!("/{}b", "a".repeat(40));
    let answers = same(&t, &["/aaaa", &runaway]).await;
    assert_eq!(answers[0].0.status, 403);
    assert_eq!(answers[1].0.status, 500);
    same_uris(&t);
    let (v, _) = t.uris();
    assert!(v.iter().all(Vec::is_empty), "{v:?}");
}
