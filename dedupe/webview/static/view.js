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

function clock(epoch) {
  return epoch ? new Date(epoch * 1000).toLocaleTimeString() : "–";
}

function status(text, down) {
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
    !data.cleared);
  return data.cleared;
}

function clearButton(row, after) {
  const button = el("button", "clear", { class: "clear", type: "button",
    title: "free this key if " + row.holder + " still holds it" });
  button.addEventListener("click", async () => {
    if (await clearKey(row.key, row.holder)) after();
  });
  return button;
}

// --- the keys page ------------------------------------------------------------------------

function filterOf() {
  const params = new URLSearchParams(location.search);
  return { task: params.get("task") || "", state: params.get("state") || "" };
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
    ? "counted at " + clock(stats.counted_at) + " (a full scan, in the background)" : "counting…";
}

function drawKeys(data) {
  const tbody = document.querySelector("#keys tbody");
  tbody.replaceChildren(...data.keys.map((row) => {
    const tr = el("tr", null, { "data-key": row.key, "data-holder": row.holder, "data-state": row.state });
    tr.append(el("td", row.task));
    const keyCell = el("td");
    const link = el("a", null, { href: "/key?name=" + encodeURIComponent(row.key) });
    link.append(el("code", row.digest + (row.run_lock ? " (run lock)" : "")));
    keyCell.append(link);
    tr.append(keyCell);
    const stateCell = el("td");
    stateCell.append(el("span", row.state, { class: "state state-" + row.state }));
    tr.append(stateCell);
    tr.append(el("td", null).appendChild(el("code", row.holder)).parentNode);
    tr.append(el("td", row.worker || "–"));
    tr.append(el("td", seconds(row.age)));
    tr.append(el("td", seconds(row.ttl)));
    tr.append(el("td", clock(row.ends_at)));
    const action = el("td");
    if (allowClear) action.append(clearButton(row, refreshKeys));
    tr.append(action);
    return tr;
  }));
  document.getElementById("more").textContent = data.keys.length === 0 ? "no live keys"
    + (filterOf().task || filterOf().state ? " match the filter" : "")
    : data.cursor ? "the first keys of a long list (one page per refresh)" : "";
}

async function refreshKeys() {
  const filter = filterOf();
  const query = new URLSearchParams();
  if (filter.task) query.set("task", filter.task);
  if (filter.state) query.set("state", filter.state);
  try {
    const [keys, stats] = await Promise.all([
      getJSON("/api/keys?" + query), getJSON("/api/stats"),
    ]);
    drawKeys(keys);
    drawTotals(stats);
    status("updated " + clock(keys.now) + ", every " + refreshMs / 1000 + " s", false);
  } catch (error) {
    status(error.message, true);
  }
}

function startKeys() {
  const filter = filterOf();
  document.getElementById("task").value = filter.task;
  document.getElementById("state").value = filter.state;
  document.getElementById("filter").addEventListener("submit", (event) => {
    event.preventDefault();
    // The filter lives in the address: a reload, a bookmark or a refresh keeps it.
    const query = new URLSearchParams();
    const task = document.getElementById("task").value.trim();
    const state = document.getElementById("state").value;
    if (task) query.set("task", task);
    if (state) query.set("state", state);
    history.replaceState(null, "", "/" + (query.toString() ? "?" + query : ""));
    refreshKeys();
  });
  refreshKeys();
  setInterval(refreshKeys, refreshMs);
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
