// The web view's pages: they read the JSON API and redraw every few seconds. Every value is
// set as text (never as HTML): task names and ids come from the processes that wrote them.
"use strict";

const body = document.body;
const refreshMs = Number(body.dataset.refreshMs) || 2000;
const allowClear = body.dataset.allowClear === "true";
const csrf = document.querySelector('meta[name="csrf-token"]').content;

// The clear token arrives once in the URL the server printed; kept for this tab only, and
// taken out of the address bar (and so out of the history and of screenshots).
(function keepClearToken() {
  const url = new URL(location.href);
  const token = url.searchParams.get("token");
  if (token) {
    sessionStorage.setItem("dedupeClearToken", token);
    url.searchParams.delete("token");
    history.replaceState(null, "", url);
  }
})();

function el(tag, text, attrs) {
  const node = document.createElement(tag);
  if (text !== undefined && text !== null) node.textContent = String(text);
  for (const [name, value] of Object.entries(attrs || {})) node.setAttribute(name, value);
  return node;
}

function seconds(value) {
  if (value === null || value === undefined) return "–";
  if (value < 120) return value.toFixed(value < 10 ? 1 : 0) + " s";
  if (value < 7200) return (value / 60).toFixed(0) + " min";
  return (value / 3600).toFixed(1) + " h";
}

// A time with its date (a key may be held for days): 2026-11-27 14:03:05, local time.
function clock(epoch) {
  if (!epoch) return "–";
  const d = new Date(epoch * 1000);
  const two = (n) => String(n).padStart(2, "0");
  return d.getFullYear() + "-" + two(d.getMonth() + 1) + "-" + two(d.getDate()) + " "
    + two(d.getHours()) + ":" + two(d.getMinutes()) + ":" + two(d.getSeconds());
}

// An action's answer (a clear) stays a few seconds before a refresh's "updated" line.
let heldUntil = 0;

function status(text, down, hold) {
  if (!down && !hold && Date.now() < heldUntil) return;
  if (hold) heldUntil = Date.now() + 5000;
  const node = document.getElementById("status");
  node.textContent = text;
  node.classList.toggle("down", Boolean(down));
}

async function getJSON(url) {
  const response = await fetch(url, { cache: "no-store" });
  const data = await response.json().catch(() => ({ error: response.statusText }));
  if (!response.ok) throw new Error(data.error || response.statusText);
  return data;
}

async function clearKey(key, holder) {
  const response = await fetch("/api/clear", {
    method: "POST",
    headers: {
      "Content-Type": "application/json",
      "X-CSRF-Token": csrf,
      "X-Dedupe-Clear-Token": sessionStorage.getItem("dedupeClearToken") || "",
    },
    body: JSON.stringify({ key: key, holder: holder }),
  });
  const data = await response.json().catch(() => ({}));
  status(data.cleared ? "cleared " + key + (data.note ? ": " + data.note : "")
    : "not cleared (" + response.status + "): " + (data.error || response.statusText),
    !data.cleared, true);
  return data.cleared;
}

function clearButton(row, after) {
  const button = el("button", "clear", { class: "clear", type: "button",
    title: "free this key if " + row.holder + " still holds it" });
  button.addEventListener("click", async () => {
    // (A clear frees a key another call may take at once: asked first.)
    if (!confirm("Free the key of " + row.task + " held by " + row.holder + "?")) return;
    if (await clearKey(row.key, row.holder)) after();
  });
  return button;
}

// --- the keys page ------------------------------------------------------------------------
// A page is found by a walk: requests that each scan a bounded stretch of the keyspace from a
// cursor, until the page is full (in SCAN's order) or the scan is done (a sorted page keeps
// the first rows of every stretch). A refresh reads again only the rows shown, unless the
// page took one request to find: its cost grows with the keys shown, not with the keyspace.

const SIZE = 200;
const keys = {
  pages: [{ cursor: 0 }], index: 0, rows: [], found: null, paused: false, walk: 0, busy: 0,
};

function filterOf() {
  const params = new URLSearchParams(location.search);
  const filter = {};
  for (const name of ["task", "q", "state", "sort"]) filter[name] = params.get(name) || "";
  return filter;
}

function place(sort, row) {
  const since = row.since === null ? Infinity : row.since;
  if (sort === "oldest") return [since, row.key];
  if (sort === "newest") return [row.since === null ? Infinity : -since, row.key];
  return [row.task, row.key];
}

function byPlace(sort) {
  return (a, b) => {
    const [x, y] = [place(sort, a), place(sort, b)];
    return x[0] < y[0] ? -1 : x[0] > y[0] ? 1 : x[1] < y[1] ? -1 : x[1] > y[1] ? 1 : 0;
  };
}

function chart(minutes) {
  // One bar pair per minute: accepted (blue) and deduplicated (amber) calls.
  const width = 160, height = 28, slot = width / Math.max(1, minutes.length);
  const most = Math.max(1, ...minutes.map((m) => Math.max(m[1], m[2])));
  const ns = "http://www.w3.org/2000/svg";
  const svg = document.createElementNS(ns, "svg");
  svg.setAttribute("class", "chart");
  svg.setAttribute("width", width);
  svg.setAttribute("height", height);
  minutes.forEach((m, i) => {
    [[m[1], "#2563eb", 0], [m[2], "#d97706", slot / 2]].forEach(([count, color, shift]) => {
      const bar = document.createElementNS(ns, "rect");
      const h = Math.round((count / most) * (height - 2));
      bar.setAttribute("x", i * slot + shift);
      bar.setAttribute("y", height - h);
      bar.setAttribute("width", Math.max(1, slot / 2 - 1));
      bar.setAttribute("height", h);
      bar.setAttribute("fill", color);
      svg.appendChild(bar);
    });
  });
  const sums = minutes.reduce((s, m) => [s[0] + m[1], s[1] + m[2]], [0, 0]);
  const title = document.createElementNS(ns, "title");
  title.textContent = sums[0] + " accepted, " + sums[1] + " deduplicated";
  svg.appendChild(title);
  return svg;
}

function drawTotals(stats) {
  const tbody = document.querySelector("#totals tbody");
  const tasks = Object.keys(Object.assign({}, stats.totals, stats.chart)).sort();
  tbody.replaceChildren(...tasks.map((task) => {
    const counts = stats.totals[task] || {};
    const tr = el("tr", null, { "data-task": task });
    tr.append(el("td", task));
    for (const state of ["provisional", "queued", "running"]) tr.append(el("td", counts[state] || 0));
    const cell = el("td");
    const minutes = stats.chart[task] || [];
    const sums = minutes.reduce((s, m) => [s[0] + m[1], s[1] + m[2]], [0, 0]);
    cell.append(chart(minutes), el("span", sums[0] + " / " + sums[1], { class: "muted" }));
    tr.append(cell);
    return tr;
  }));
  const list = document.getElementById("tasks");
  list.replaceChildren(...tasks.map((task) => el("option", null, { value: task })));
  document.getElementById("counted").textContent = stats.counted_at
    ? "counted at " + clock(stats.counted_at) + " (a full scan, while a page looks)" : "counting…";
}

async function walk(start) {
  const filter = filterOf();
  const walkId = ++keys.walk;
  // A page in SCAN's order begins with what the page before found beyond its size: one
  // SCAN may answer a few more keys than asked, and its cursor is past them all.
  let rows = filter.sort ? [] : (start.carry || []).slice();
  let cursor = filter.sort ? 0 : start.cursor, requests = 0, looked = 0;
  let more = filter.sort || !(start.carry && start.cursor === 0) && rows.length < SIZE;
  while (more) {
    const query = new URLSearchParams();
    for (const [name, value] of Object.entries(filter)) if (value) query.set(name, value);
    query.set("cursor", cursor);
    query.set("size", filter.sort ? SIZE : SIZE - rows.length);
    if (filter.sort && start.after) {
      query.set("after", start.after);
      if (start.since !== null && start.since !== undefined) query.set("since", start.since);
    }
    const data = await getJSON("/api/keys?" + query);
    if (walkId !== keys.walk) return null;  // (a newer walk began: this one is dropped)
    rows = filter.sort ? rows.concat(data.keys).sort(byPlace(filter.sort)).slice(0, SIZE)
      : rows.concat(data.keys);
    cursor = data.cursor;
    requests += 1;
    looked += data.looked_at;
    if (cursor !== 0) {
      document.getElementById("found").textContent = "looking… " + rows.length
        + " found in about " + looked.toLocaleString() + " keys looked at";
    }
    more = cursor !== 0 && (filter.sort || rows.length < SIZE);
  }
  const carry = filter.sort ? [] : rows.slice(SIZE);
  rows = rows.slice(0, SIZE);
  return { rows, cursor, carry, requests, looked, now: Date.now() / 1000 };
}

function nextStart(found) {
  if (!filterOf().sort) {
    return found.cursor !== 0 || found.carry.length ? { cursor: found.cursor, carry: found.carry } : null;
  }
  const last = found.rows[found.rows.length - 1];
  return found.rows.length === SIZE ? { after: last.key, since: last.since } : null;
}

async function find() {
  const found = await walk(keys.pages[keys.index]);
  if (found === null) return;
  keys.found = found;
  keys.rows = found.rows;
  const next = nextStart(found);
  keys.pages.length = keys.index + 1;
  if (next) keys.pages.push(next);
  drawKeys();
}

function drawKeys() {
  const filter = filterOf(), found = keys.found;
  const tbody = document.querySelector("#keys tbody");
  tbody.replaceChildren(...keys.rows.map((row) => {
    const tr = el("tr", null, { "data-key": row.key, "data-holder": row.holder, "data-state": row.state });
    tr.append(el("td", row.task));
    const keyCell = el("td");
    const link = el("a", null, { href: "/key?name=" + encodeURIComponent(row.key) });
    link.append(el("code", row.digest + (row.run_lock ? " (run lock)" : "")));
    keyCell.append(link);
    tr.append(keyCell);
    const stateCell = el("td");
    stateCell.append(el("span", row.state, { class: "state state-" + row.state }));
    if (row.no_message) {
      // The reaper's last pass found its message in no queue and no worker: its next frees it.
      stateCell.append(el("span", " no message", { class: "no-message", title: "the reaper found its message gone (purged or dropped); its next pass frees the key" }));
    }
    tr.append(stateCell);
    tr.append(el("td", null).appendChild(el("code", row.holder)).parentNode);
    tr.append(el("td", row.node ? row.node + " (" + row.worker + ")" : row.worker || "–"));
    tr.append(el("td", clock(row.since) + " (" + seconds(row.age) + " ago)"));
    tr.append(el("td", seconds(row.ttl)));
    tr.append(el("td", clock(row.ends_at)));
    const action = el("td");
    if (allowClear) action.append(clearButton(row, find));
    tr.append(action);
    return tr;
  }));
  const filtered = filter.task || filter.q || filter.state;
  const more = keys.index + 1 < keys.pages.length;
  let text;
  if (keys.rows.length === 0 && keys.index === 0) {
    text = "no live keys" + (filtered ? " match the filter" : "") + " (all looked at)";
  } else if (!more && keys.index === 0) {
    const n = keys.rows.length;
    text = n + (filtered ? (n === 1 ? " key matches" : " keys match") : n === 1 ? " live key"
      : " live keys") + " (all looked at)";
  } else {
    text = "rows " + (keys.index * SIZE + 1) + "–" + (keys.index * SIZE + keys.rows.length)
      + (more ? "; more follow" : "; the last page") + (filter.sort ? "" : " (in the order found)");
  }
  if (found && found.requests > 1) {
    text += "; found by " + found.requests + " requests looking at about "
      + found.looked.toLocaleString() + " keys: the refresh reads these rows again (find "
      + "again for keys made since)";
  }
  document.getElementById("found").textContent = text;
  document.getElementById("page-number").textContent = "page " + (keys.index + 1);
  document.getElementById("previous").disabled = keys.index === 0;
  document.getElementById("next").disabled = !more;
}

async function rereadRows() {
  const response = await fetch("/api/rows", {
    method: "POST",
    headers: { "Content-Type": "application/json" },
    body: JSON.stringify({ keys: keys.rows.map((row) => row.key) }),
  });
  const data = await response.json().catch(() => ({ error: response.statusText }));
  if (!response.ok) throw new Error(data.error || response.statusText);
  keys.rows = data.keys;
  drawKeys();
}

// The calls that wait for their turn under a key's limit: a key_concurrency line's (handed a
// slot, or waiting) and a key_rate_limit key's planned starts. Of the filter's task only.
function waitingUrl() {
  const task = filterOf().task;
  return "/api/waiting" + (task ? "?" + new URLSearchParams({ task: task }) : "");
}

function drawWaiting(data) {
  const tbody = document.querySelector("#waiting tbody");
  tbody.replaceChildren(...data.calls.map((call) => {
    const planned = call.limit === "key_rate_limit";
    const state = planned ? "planned" : call.handed ? "handed" : "waiting";
    const tr = el("tr", null, { "data-task-id": call.task_id, "data-state": state });
    tr.append(el("td", call.task));
    const keyCell = el("td");
    const link = el("a", null, { href: "/key?name=" + encodeURIComponent(call.key) });
    link.append(el("code", call.digest));
    keyCell.append(link);
    tr.append(keyCell);
    tr.append(el("td", null).appendChild(el("code", call.task_id)).parentNode);
    tr.append(el("td", call.limit), el("td", "#" + call.position));
    const stateCell = el("td");
    stateCell.append(el("span", state, { class: "state state-" + state, title: planned
      ? "its start is reserved" : call.handed ? "a slot was handed to it; its run has not started yet"
      : "it waits for a slot" }));
    tr.append(stateCell);
    tr.append(el("td", planned ? clock(call.due_at) + " (in "
      + seconds(Math.max(0, call.due_at - data.now)) + ")"
      : call.handed ? "when a worker takes it" : "when a slot frees"));
    return tr;
  }));
  const n = data.calls.length;
  let text = data.note || (n === 0 ? "no call waits for its turn"
    : n + (n === 1 ? " call waits" : " calls wait") + (data.more ? ": the first " + data.most
      + " shown, more wait" : ""));
  if (data.read_at) text += " (read at " + clock(data.read_at) + ")";
  document.getElementById("waiting-found").textContent = text;
}

async function refreshKeys(asked) {
  // (A tick while a walk goes on waits for the next: a long walk is never begun again.)
  if (keys.busy && !asked) return;
  keys.busy += 1;
  try {
    // (A page found by one request is found again; a longer walk's rows are read again.)
    const walkAgain = keys.found === null || keys.found.requests <= 1;
    const [, stats, waiting] = await Promise.all([
      walkAgain ? find() : rereadRows(), getJSON("/api/stats"), getJSON(waitingUrl()),
    ]);
    drawTotals(stats);
    drawWaiting(waiting);
    status("updated " + clock(stats.now) + ", every " + refreshMs / 1000 + " s", false);
  } catch (error) {
    status(error.message, true);
  } finally {
    keys.busy -= 1;
  }
}

function startKeys() {
  const filter = filterOf();
  for (const name of ["task", "q", "state", "sort"]) document.getElementById(name).value = filter[name];
  const restart = () => {
    keys.pages = [{ cursor: 0 }];
    keys.index = 0;
    keys.found = null;
    refreshKeys(true);
  };
  document.getElementById("filter").addEventListener("submit", (event) => {
    event.preventDefault();
    // The filter lives in the address: a reload, a bookmark or a refresh keeps it.
    const query = new URLSearchParams();
    for (const name of ["task", "q", "state", "sort"]) {
      const value = document.getElementById(name).value.trim();
      if (value) query.set(name, value);
    }
    history.replaceState(null, "", "/" + (query.toString() ? "?" + query : ""));
    restart();
  });
  const turn = (step) => {
    keys.index += step;
    keys.found = null;
    refreshKeys(true);
  };
  document.getElementById("next").addEventListener("click", () => turn(1));
  document.getElementById("previous").addEventListener("click", () => turn(-1));
  const pause = document.getElementById("pause");
  pause.addEventListener("click", () => {
    keys.paused = !keys.paused;
    pause.setAttribute("aria-pressed", String(keys.paused));
    pause.textContent = keys.paused ? "resume" : "pause";
    if (keys.paused) status("paused: the page is not refreshed", false, true);
    else refreshKeys(true);
  });
  refreshKeys();
  setInterval(() => { if (!keys.paused) refreshKeys(); }, refreshMs);
}

// --- a key's page -------------------------------------------------------------------------

async function refreshKey() {
  const name = new URLSearchParams(location.search).get("name") || "";
  document.getElementById("name").textContent = name;
  try {
    const data = await getJSON("/api/key?name=" + encodeURIComponent(name));
    const tbody = document.querySelector("#record tbody");
    const row = data.row;
    const fields = row ? [
      ["task", row.task], ["state", row.state], ["holder task id", row.holder],
      ["worker (host:pid)", row.worker || "–"], ["arguments digest", row.digest],
      ["since", clock(row.since) + " (" + seconds(row.age) + " ago)"],
      ["eta", row.eta ? clock(row.eta) : "–"], ["time left", seconds(row.ttl)],
      ["lease or TTL ends", clock(row.ends_at)], ["run lock", row.run_lock ? "yes" : "no"],
    ] : [["state", "free: no task holds this key"]];
    tbody.replaceChildren(...fields.map(([label, value]) => {
      const tr = el("tr");
      tr.append(el("th", label), el("td", value));
      return tr;
    }));
    const actions = document.getElementById("actions");
    actions.replaceChildren();
    if (row && allowClear) actions.append(clearButton(row, refreshKey));
    document.getElementById("log").textContent = data.view_log
      ? "Events are logged by the processes whose app sets dedupe_web_events = True, while a "
        + "web view runs (the last 200 per task, 15 minutes)."
      : "The event log is off.";
    document.querySelector("#events tbody").replaceChildren(...data.events.map((event) => {
      const tr = el("tr", null, event.key === name ? { class: "this-key" } : {});
      const details = Object.entries(event)
        .filter(([k]) => !["event", "task_id", "key", "at", "holder", "holder_state"].includes(k))
        .map(([k, v]) => k + "=" + v).join(", ");
      tr.append(el("td", clock(Number(event.at))), el("td", event.event), el("td", event.task_id),
        el("td", event.holder ? event.holder + " (" + event.holder_state + ")" : "–"),
        el("td", (event.key === name ? "this key" : "another key") + (details ? "; " + details : "")));
      return tr;
    }));
    status("updated " + clock(data.now), false);
  } catch (error) {
    status(error.message, true);
  }
}

if (body.dataset.page === "keys") startKeys();
if (body.dataset.page === "key") { refreshKey(); setInterval(refreshKey, refreshMs); }
