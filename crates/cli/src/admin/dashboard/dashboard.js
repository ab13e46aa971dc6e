// vigil dashboard: refreshes the server-rendered tables in place every
// second (GET /dashboard/upstreams), keeps a short latency history per
// peer and draws it, follows the event log (GET /api/events?since=), and
// sends drain / up / down with the admin token of this tab
// (sessionStorage; only ever sent as an Authorization header).
(function () {
  "use strict";
  var POLL_MS = 1000;
  var HISTORY = 60;
  var MAX_EVENTS = 200;
  var KEY = "vigil.adminToken";
  var SVG = "http://www.w3.org/2000/svg";

  var body = document.body;
  var writes = body.getAttribute("data-writes") === "enabled";
  var live = document.getElementById("live");
  var main = document.getElementById("upstreams");
  var log = document.getElementById("events");
  var authState = document.getElementById("auth-state");
  var tokenInput = document.getElementById("token");
  var result = document.getElementById("action-result");
  var history = new Map(); // "upstream\u0000peer" -> {at, values[]}
  var polls = 0;
  var timer = null;

  function clock(ms) {
    return new Date(ms).toISOString().slice(11, 19) + " UTC";
  }

  function getToken() {
    try {
      return sessionStorage.getItem(KEY) || "";
    } catch (e) {
      return "";
    }
  }

  function setToken(t) {
    try {
      if (t) {
        sessionStorage.setItem(KEY, t);
      } else {
        sessionStorage.removeItem(KEY);
      }
    } catch (e) {
      say("This browser does not let the page keep the token (sessionStorage).", true);
    }
    applyAuth();
  }

  function say(text, bad) {
    if (!result) return;
    result.textContent = text;
    result.className = bad ? "bad" : "ok";
  }

  function applyAuth() {
    var has = writes && getToken() !== "";
    if (authState && writes) {
      authState.textContent = has
        ? "Token set for this tab: drain, up and down act at once; the server checks the token on every request."
        : "Enter the admin token to enable drain, up and down. It stays in this tab (sessionStorage) and is sent only in the Authorization header.";
    }
    var buttons = main.querySelectorAll("button.act");
    for (var i = 0; i < buttons.length; i++) {
      var b = buttons[i];
      b.disabled = !has;
      b.title = !writes
        ? "no admin token is configured on this server"
        : has
          ? b.getAttribute("data-action") + " " + b.getAttribute("data-peer")
          : "enter the admin token first";
    }
  }

  // --- latency history ---------------------------------------------------

  function sample() {
    var rows = main.querySelectorAll("section.upstream tr.peer");
    for (var i = 0; i < rows.length; i++) {
      var tr = rows[i];
      var section = tr.closest("section.upstream");
      var key = section.getAttribute("data-upstream") + "\u0000" + tr.getAttribute("data-peer");
      var h = history.get(key);
      if (!h) {
        h = { at: null, values: [] };
        history.set(key, h);
      }
      var us = tr.getAttribute("data-latency-us");
      var at = tr.getAttribute("data-latency-at");
      if (us !== null && us !== "" && at !== h.at) {
        h.at = at;
        h.values.push(Number(us));
        if (h.values.length > HISTORY) h.values.shift();
      }
      tr.setAttribute("data-samples", String(h.values.length));
      draw(tr.querySelector("svg.spark"), h.values, tr.getAttribute("data-latency-kind"));
    }
  }

  function draw(svg, values, kind) {
    if (!svg) return;
    while (svg.firstChild) svg.removeChild(svg.firstChild);
    if (values.length === 0) return;
    var max = Math.max.apply(null, values) || 1;
    var min = Math.min.apply(null, values);
    var step = values.length > 1 ? 118 / (HISTORY - 1) : 0;
    var x0 = 119 - step * (values.length - 1);
    var points = values.map(function (v, i) {
      return (x0 + i * step).toFixed(1) + "," + (22 - (v / max) * 20).toFixed(1);
    });
    var line = document.createElementNS(SVG, values.length > 1 ? "polyline" : "circle");
    if (values.length > 1) {
      line.setAttribute("points", points.join(" "));
    } else {
      var xy = points[0].split(",");
      line.setAttribute("cx", xy[0]);
      line.setAttribute("cy", xy[1]);
      line.setAttribute("r", "1.5");
    }
    line.setAttribute("class", "line");
    svg.appendChild(line);
    var title = document.createElementNS(SVG, "title");
    title.textContent = (kind === "header" ? "time-to-header median" : "probe time") +
      ", last " + values.length + " sample(s): " + (min / 1000).toFixed(2) + " to " +
      (max / 1000).toFixed(2) + " ms";
    svg.appendChild(title);
  }

  // --- event log -----------------------------------------------------------

  function addEvent(e) {
    var li = document.createElement("li");
    li.setAttribute("data-seq", String(e.seq));
    li.setAttribute("data-kind", e.kind);
    li.setAttribute("data-live", "1");
    var t = document.createElement("time");
    t.textContent = clock(e.at_unix_ms);
    var k = document.createElement("span");
    k.className = "kind";
    k.textContent = e.kind;
    var u = document.createElement("code");
    u.textContent = e.upstream;
    var p = document.createElement("code");
    p.textContent = e.peer;
    li.append(t, " ", k, " ", u, " ", p, " ", e.text);
    log.insertBefore(li, log.firstChild);
  }

  function takeEvents(doc) {
    var empty = log.querySelector("li.empty");
    if (empty && doc.events.length > 0) empty.remove();
    if (doc.missed > 0) {
      var m = document.createElement("li");
      m.className = "missed";
      m.textContent = doc.missed + " event(s) left the log before they could be shown.";
      log.insertBefore(m, log.firstChild);
    }
    doc.events.forEach(addEvent);
    while (log.children.length > MAX_EVENTS) log.removeChild(log.lastChild);
    log.setAttribute("data-next", String(doc.next));
  }

  // --- polling ---------------------------------------------------------------

  function fetchOk(url, opts) {
    return fetch(url, opts).then(function (r) {
      if (!r.ok) throw new Error(url + ": HTTP " + r.status);
      return r;
    });
  }

  function refresh() {
    var since = log.getAttribute("data-next") || "0";
    var opts = { cache: "no-store", credentials: "same-origin" };
    var tables = fetchOk("/dashboard/upstreams", opts)
      .then(function (r) { return r.text(); })
      .then(function (html) {
        var doc = new DOMParser().parseFromString(html, "text/html");
        main.replaceChildren.apply(main, Array.prototype.slice.call(doc.body.childNodes));
        applyAuth();
        sample();
      });
    var evs = fetchOk("/api/events?since=" + encodeURIComponent(since) + "&limit=" + MAX_EVENTS, opts)
      .then(function (r) { return r.json(); })
      .then(takeEvents);
    return Promise.all([tables, evs]).then(
      function () {
        polls += 1;
        body.setAttribute("data-polls", String(polls));
        live.textContent = "Live: updated " + clock(Date.now()) + " (every " + POLL_MS / 1000 + " s).";
        live.className = "live";
      },
      function (err) {
        live.textContent = "Connection lost at " + clock(Date.now()) + " (" + err.message + "); retrying.";
        live.className = "lost";
      }
    );
  }

  function schedule(ms) {
    if (timer !== null) clearTimeout(timer);
    timer = setTimeout(tick, ms);
  }

  function tick() {
    timer = null;
    if (document.hidden) {
      schedule(POLL_MS);
      return;
    }
    refresh().then(function () { schedule(POLL_MS); });
  }

  // --- actions ---------------------------------------------------------------

  function act(button) {
    var t = getToken();
    if (!writes || t === "") return;
    var up = button.getAttribute("data-upstream");
    var peer = button.getAttribute("data-peer");
    var action = button.getAttribute("data-action");
    var url = "/api/peers/" + encodeURIComponent(up) + "/" + encodeURIComponent(peer) + "/" + encodeURIComponent(action);
    button.disabled = true;
    fetch(url, { method: "POST", cache: "no-store", credentials: "same-origin", headers: { Authorization: "Bearer " + t } })
      .then(function (r) {
        return r.json().catch(function () { return {}; }).then(function (doc) {
          if (r.ok) {
            say(up + " " + peer + ": " + doc.from + " -> " + doc.to, false);
          } else if (r.status === 401) {
            say("The token was refused (401): " + (doc.error || "") + ". Enter it again.", true);
          } else {
            say(action + " " + peer + " failed (HTTP " + r.status + "): " + (doc.error || ""), true);
          }
        });
      }, function (err) {
        say(action + " " + peer + " failed: " + err.message, true);
      })
      .then(function () { schedule(0); });
  }

  main.addEventListener("click", function (ev) {
    var b = ev.target.closest("button.act");
    if (b && !b.disabled) act(b);
  });

  if (tokenInput) {
    var use = function () {
      var v = tokenInput.value.trim();
      tokenInput.value = "";
      setToken(v);
      say(v ? "Token kept for this tab." : "No token entered.", !v);
    };
    document.getElementById("token-use").addEventListener("click", use);
    tokenInput.addEventListener("keydown", function (ev) {
      if (ev.key === "Enter") use();
    });
    document.getElementById("token-forget").addEventListener("click", function () {
      setToken("");
      say("Token forgotten.", false);
    });
  }

  applyAuth();
  sample();
  live.textContent = "Live: loading...";
  schedule(POLL_MS);
})();
