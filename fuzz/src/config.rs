//! `nginx_conf` and `toml_conf`: the two configuration front ends on
//! arbitrary text, and `vigil convert`'s round trip on what loads.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use vigil_config::convert::nginx_to_toml;
use vigil_config::lint::{lint_config, lint_loaded};
use vigil_config::nginx::{self, syntax::Includes};
use vigil_config::{literal_resolver, toml};

/// nginx.conf bytes → tokenizer, parser (with `include`) and model build, as
/// `vigil serve --nginx-conf` runs them, and in the lenient mode of `vigil
/// lint` (checked against the strict load); then lint, and `vigil convert`
/// whose TOML must load back into the same model.
///
/// Includes never touch the disk: they are served from memory, where
/// `/fuzz/a.conf` is the input itself (so `include a.conf;` recurses into
/// a cycle error) and `/fuzz/conf.d/u.conf` holds an upstream block.
pub fn nginx_conf(data: &[u8]) {
    let src = String::from_utf8_lossy(data);
    let mut files = BTreeMap::new();
    files.insert(PathBuf::from("/fuzz/a.conf"), src.to_string());
    files.insert(
        PathBuf::from("/fuzz/conf.d/u.conf"),
        "upstream included { server 127.0.0.1:9; }".to_string(),
    );
    let strict = nginx::load_str_with(
        &src,
        Path::new("/fuzz/nginx.conf"),
        Path::new("/fuzz"),
        &literal_resolver,
        Includes::Memory(&files),
    );
    // `vigil lint`'s lenient mode on the same text: it fails only where
    // parsing fails, its first refusal is the strict error, and without
    // refusals it builds the strict model.
    let lenient = nginx::load_str_mode(
        &src,
        Path::new("/fuzz/nginx.conf"),
        Path::new("/fuzz"),
        &literal_resolver,
        Includes::Memory(&files),
        nginx::Mode::Lenient,
    );
    match (&strict, &lenient) {
        (_, Ok(l)) => {
            let _ = lint_loaded(l);
            match (&strict, l.refusals.first()) {
                (Ok(s), None) => assert!(
                    s.config == l.config && s.sources == l.sources,
                    "lenient and strict models differ\n--- nginx.conf ---\n{src}"
                ),
                (Err(e), Some(first)) => assert_eq!(
                    e.to_string(),
                    first.to_string(),
                    "strict error is not the first lenient refusal\n--- nginx.conf ---\n{src}"
                ),
                (Ok(_), Some(first)) => {
                    panic!("strict loads, lenient refused {first}\n--- nginx.conf ---\n{src}")
                }
                (Err(e), None) => {
                    panic!("strict refused {e}, lenient did not\n--- nginx.conf ---\n{src}")
                }
            }
        }
        (Ok(_), Err(e)) => panic!("strict loads, lenient fails: {e}\n--- nginx.conf ---\n{src}"),
        (Err(s), Err(l)) => assert_eq!(s.to_string(), l.to_string(), "parse errors differ"),
    }
    let Ok(loaded) = strict else {
        return;
    };
    let _ = lint_config(&loaded.config);
    // `vigil convert` refuses what the TOML schema cannot carry.
    if !vigil_config::convert::untranslatable(&loaded.config).is_empty() {
        return;
    }
    let text = nginx_to_toml(&loaded);
    match toml::load_str(&text, Path::new("converted.toml"), &literal_resolver) {
        Ok(back) => assert!(
            back == loaded.config,
            "vigil convert changed the model\n--- nginx.conf ---\n{src}\n--- converted ---\n{text}"
        ),
        Err(e) => panic!(
            "vigil convert wrote TOML that does not load: {e}\n--- nginx.conf ---\n{src}\n--- converted ---\n{text}"
        ),
    }
}

/// `vigil.toml` bytes → the TOML front end; what loads is linted, written
/// back (`to_toml_string`) and must load into the same model.
pub fn toml_conf(data: &[u8]) {
    let Ok(src) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(config) = toml::load_str(src, Path::new("vigil.toml"), &literal_resolver) else {
        return;
    };
    let _ = lint_config(&config);
    let text = toml::to_toml_string(&config);
    match toml::load_str(&text, Path::new("written.toml"), &literal_resolver) {
        Ok(back) => assert!(
            back == config,
            "writing the TOML changed the model\n--- input ---\n{src}\n--- written ---\n{text}"
        ),
        Err(e) => panic!(
            "the written TOML does not load: {e}\n--- input ---\n{src}\n--- written ---\n{text}"
        ),
    }
}
