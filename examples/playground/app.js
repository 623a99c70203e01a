// tollgate playground: draws what the server decides. No rate-limiting logic lives here.
"use strict";

const ABOUT = {
  "fixed-window": "Counts per clock-aligned window; resets at each edge. Cheapest, but lets 2N through across an edge.",
  "fixed-window-first-hit": "A window opens at the first request and lasts one period.",
  "moving-window": "Exact sliding log: at most N in any trailing period. Memory grows with N.",
  "sliding-window": "Two counters: the current window plus the previous one weighted by its overlap.",
  "token-bucket": "GCRA: a burst of B, then refills at N per period.",
  "leaky-bucket": "A meter of capacity B draining at N per period; rejects when full.",
};
const NS = "http://www.w3.org/2000/svg";
const W = 400, BAND_TOP = 6, BAND_BOTTOM = 86, H = 104;

let session = null;
let settings = { limit: 5, period_s: 10, burst: 5 };
let offset = 0;            // server ms (session-relative) minus performance.now()
let running = true;
let dots = {};             // strategy -> [{t, i, ok}]
let latest = null;         // last state applied
let shown = {};            // strategy -> allowed + blocked displayed
let generation = 0;        // bumps on every new session
let plan = null;           // the stream's next step

const $ = (sel) => document.querySelector(sel);
const serverNow = () => performance.now() + offset;

async function api(method, path, body) {
  const res = await fetch(path, {
    method,
    headers: body ? { "content-type": "application/json" } : {},
    body: body ? JSON.stringify(body) : undefined,
  });
  const data = await res.json();
  return { status: res.status, data };
}

function el(name, attrs, parent) {
  const e = document.createElementNS(NS, name);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
  if (parent) parent.appendChild(e);
  return e;
}

function buildPanels(state) {
  const root = $("#panels");
  root.textContent = "";
  dots = {};
  shown = {};
  for (const p of state.panels) {
    dots[p.strategy] = [];
    shown[p.strategy] = 0;
    const panel = document.createElement("article");
    panel.className = "panel";
    panel.dataset.strategy = p.strategy;
    panel.dataset.allowed = "0";
    panel.dataset.blocked = "0";
    panel.innerHTML = `<h2>${p.strategy}</h2><p class="about">${ABOUT[p.strategy] || ""}</p>`;
    const svg = el("svg", { class: "timeline", viewBox: `0 0 ${W} ${H}`, role: "img",
      "aria-label": `timeline of ${p.strategy}` }, panel);
    svg.dataset.role = "timeline";
    const counts = document.createElement("div");
    counts.className = "counts";
    counts.innerHTML = `<span class="ok">&#10003; admitted <b data-count="allowed">0</b></span>` +
      `<span class="no">&#10007; rejected <b data-count="blocked">0</b></span><span class="state"></span>`;
    panel.appendChild(counts);
    root.appendChild(panel);
  }
}

function apply(state, gen) {
  if (gen !== generation) return;
  offset = state.now_ms - performance.now();
  for (const p of state.panels) {
    const total = p.allowed + p.blocked;
    if (total < shown[p.strategy]) return; // an older answer arriving late: counts never go back
  }
  latest = state;
  for (const p of state.panels) {
    shown[p.strategy] = p.allowed + p.blocked;
    const panel = document.querySelector(`[data-strategy="${p.strategy}"]`);
    panel.dataset.allowed = String(p.allowed);
    panel.dataset.blocked = String(p.blocked);
    panel.querySelector('[data-count="allowed"]').textContent = p.allowed;
    panel.querySelector('[data-count="blocked"]').textContent = p.blocked;
    const reset = p.reset_ms > 0 ? `, full again in ${(p.reset_ms / 1000).toFixed(1)} s` : "";
    panel.querySelector(".state").textContent = `remaining ${p.remaining} of ${p.limit}${reset}`;
  }
  const by = Object.fromEntries(state.panels.map((p) => [p.strategy, p]));
  const exact = by["moving-window"], approx = by["sliding-window"];
  $("#compare").textContent =
    `Exact log (moving-window) rejected ${exact.blocked}; approximated counter (sliding-window) ` +
    `rejected ${approx.blocked} of the same ${approx.allowed + approx.blocked} requests ` +
    `(difference ${approx.blocked - exact.blocked}).`;
}

async function newSession() {
  const gen = ++generation;
  session = null; // no hit or poll for the old session lands in the new panels
  const { status, data } = await api("POST", "/api/session", settings);
  if (status !== 200) { $("#stream-status").textContent = data.error; return; }
  if (gen !== generation) return;
  session = data.session;
  document.body.dataset.session = session;
  buildPanels(data);
  apply(data, gen);
  plan = null;
}

async function hit(count) {
  if (!session) return;
  const gen = generation, sid = session;
  const { status, data } = await api("POST", "/api/hit", { session: sid, count });
  if (sid !== session || gen !== generation) return;
  if (status === 404) { await newSession(); return; }
  if (status !== 200) return;
  for (const d of data.decisions) {
    const list = dots[d.strategy];
    list.push({ t: d.t_ms, i: d.index, ok: d.allowed });
    if (list.length > 400) list.splice(0, list.length - 400);
  }
  apply(data, gen);
}

async function poll() {
  if (!session) return;
  const gen = generation, sid = session;
  try {
    const { status, data } = await api("GET", `/api/state?session=${encodeURIComponent(sid)}`);
    if (sid !== session || gen !== generation) return;
    if (status === 404) { await newSession(); return; }
    if (status === 200) apply(data, gen);
  } catch (_) { /* the server went away; the next poll retries */ }
}

// The automatic stream: decides when to send, never whether a request is admitted.
function streamTick() {
  if (!running || !latest || $("#strategies").hidden) return;
  const now = serverNow();
  const period = settings.period_s * 1000;
  const mode = $("#traffic").value;
  if (!plan || plan.mode !== mode) plan = { mode, next: now, fired: 0 };
  if (mode === "steady") {
    if (now >= plan.next) { hit(1); plan.next = Math.max(plan.next + Math.max(150, period / (2 * settings.limit)), now - 1000); }
  } else if (mode === "bursts") {
    if (now >= plan.next) { hit(Math.min(50, 2 * settings.limit)); plan.next = now + 1.5 * period; }
  } else {
    if (plan.edge === undefined) {
      const fixed = latest.panels.find((p) => p.strategy === "fixed-window");
      plan.edge = fixed.window.end_ms;
      plan.fired = 0;
    }
    const n = Math.min(50, settings.limit);
    const early = Math.max(60, period * 0.03);
    if (plan.fired === 0 && now >= plan.edge - early) { hit(n); plan.fired = 1; }
    if (plan.fired === 1 && now >= plan.edge + 30) { hit(n); plan.fired = 2; plan.edge += 2 * period; plan.fired = 0; }
  }
}

function draw() {
  requestAnimationFrame(draw);
  if (!latest) return;
  const now = serverNow();
  const period = settings.period_s * 1000;
  const span = Math.min(120000, Math.max(15000, 3 * period));
  const from = now - span;
  for (const p of latest.panels) {
    const panel = document.querySelector(`[data-strategy="${p.strategy}"]`);
    if (!panel) continue;
    const svg = panel.querySelector("svg.timeline");
    const bucket = !!p.bucket;
    const width = bucket ? W - 62 : W;
    const x = (t) => 5 + Math.max(0, Math.min(1, (t - from) / span)) * (width - 10);
    svg.textContent = "";
    el("rect", { x: 0, y: BAND_TOP, width, height: BAND_BOTTOM - BAND_TOP, fill: "#fafbfc", stroke: "#e3e6eb" }, svg);
    if (p.previous) {
      const pr = p.previous;
      el("rect", { x: x(pr.start_ms), y: BAND_TOP, width: x(pr.end_ms) - x(pr.start_ms), height: BAND_BOTTOM - BAND_TOP,
        fill: "var(--prev)", "fill-opacity": 0.25 + 0.75 * pr.weight }, svg);
      const t = el("text", { x: x(pr.start_ms) + 4, y: BAND_TOP + 26, "font-size": 11, fill: "#6b5311" }, svg);
      t.textContent = `prev ${pr.count} × ${pr.weight.toFixed(2)}`;
    }
    if (p.window) {
      const w = p.window;
      el("rect", { x: x(w.start_ms), y: BAND_TOP, width: Math.max(1, x(w.end_ms) - x(w.start_ms)), height: BAND_BOTTOM - BAND_TOP,
        fill: "var(--win)", "fill-opacity": 0.7, stroke: "#5d8fd6", "stroke-dasharray": "4 3" }, svg);
      const t = el("text", { x: Math.min(Math.max(x(w.start_ms), 0) + 4, width - 84), y: BAND_TOP + 12, "font-size": 11, fill: "#1f4e8c" }, svg);
      t.textContent = `${w.count}/${p.limit} in window`;
    }
    // Dots closer than their size stack upwards, so every request stays visible.
    let lastX = -100, level = 0;
    for (const d of dots[p.strategy]) {
      if (d.t < from) continue;
      const cx = x(d.t);
      level = cx - lastX < 7 ? Math.min(level + 1, 8) : 0;
      lastX = cx;
      const cy = BAND_BOTTOM - 8 - level * 8;
      if (d.ok) el("circle", { cx, cy, r: 3.6, class: "dot-ok" }, svg);
      else el("path", { d: `M${cx - 3.5} ${cy - 3.5}L${cx + 3.5} ${cy + 3.5}M${cx + 3.5} ${cy - 3.5}L${cx - 3.5} ${cy + 3.5}`, class: "dot-no" }, svg);
    }
    el("line", { x1: x(now), x2: x(now), y1: BAND_TOP - 4, y2: BAND_BOTTOM + 4, stroke: "#1d2433", "stroke-width": 1.5 }, svg);
    const axis = el("text", { x: 0, y: H - 4, "font-size": 11, fill: "#5b6475" }, svg);
    axis.textContent = `−${Math.round(span / 1000)} s`;
    const nowLabel = el("text", { x: width, y: H - 4, "font-size": 11, fill: "#5b6475", "text-anchor": "end" }, svg);
    nowLabel.textContent = "now";
    if (bucket) {
      const b = p.bucket, bx = W - 44, h = BAND_BOTTOM - BAND_TOP;
      el("rect", { x: bx, y: BAND_TOP, width: 36, height: h, fill: "#fff", stroke: "#5b6475", rx: 3 }, svg);
      const lh = (b.level / Math.max(1, b.capacity)) * h;
      el("rect", { x: bx + 2, y: BAND_BOTTOM - lh, width: 32, height: lh, fill: "var(--bucket)" }, svg);
      const t = el("text", { x: bx + 18, y: H - 4, "font-size": 11, "text-anchor": "middle", fill: "#1d2433" }, svg);
      t.textContent = `${b.level}/${b.capacity}`;
      const kind = el("title", {}, t);
      kind.textContent = p.strategy === "token-bucket" ? "tokens left" : "water in the bucket";
    }
  }
}

// The chat demo: a spammer and two people; the server's token bucket decides.
const chatTimers = [];
async function post(user, text) {
  if (!session) return;
  const { status, data } = await api("POST", "/api/chat", { session, user });
  if (status === 404) { await newSession(); return; }
  if (status !== 200) return;
  const li = document.createElement("li");
  li.className = data.allowed ? "sent" : "blocked";
  const tag = data.allowed ? `sent (${data.remaining} left)` : `blocked, retry in ${Math.ceil(data.retry_ms / 1000)} s`;
  li.innerHTML = `<span class="who"></span><span class="text"></span><span class="tag"></span>`;
  li.querySelector(".who").textContent = user;
  li.querySelector(".text").textContent = text;
  li.querySelector(".tag").textContent = tag;
  const log = $("#chat-log");
  log.prepend(li);
  while (log.children.length > 80) log.lastChild.remove();
}
function startChat() {
  const lines = ["BUY NOW!!!", "free coins", "click here", "best deals", "spam spam spam"];
  let n = 0;
  chatTimers.push(setInterval(() => post("spammer", lines[n++ % lines.length]), 700));
  chatTimers.push(setInterval(() => post("alice", "has anyone tried the sliding window?"), 5300));
  chatTimers.push(setInterval(() => post("bob", "the token bucket lets my bursts through"), 7100));
}
function stopChat() { while (chatTimers.length) clearInterval(chatTimers.pop()); }

function showTab(name) {
  for (const b of document.querySelectorAll("[data-tab]")) b.setAttribute("aria-selected", String(b.dataset.tab === name));
  $("#strategies").hidden = name !== "strategies";
  $("#chat").hidden = name !== "chat";
  if (name === "chat") startChat(); else stopChat();
}

function setRunning(on) {
  running = on;
  plan = null;
  $("#stream-status").textContent = on ? "stream running" : "stream paused";
}

document.addEventListener("DOMContentLoaded", async () => {
  $('[data-action="hit"]').addEventListener("click", () => hit(1));
  $('[data-action="pause"]').addEventListener("click", () => setRunning(false));
  $('[data-action="play"]').addEventListener("click", () => setRunning(true));
  $("#traffic").addEventListener("change", () => { plan = null; });
  $("#settings").addEventListener("submit", (e) => {
    e.preventDefault();
    settings = {
      limit: Number($("#limit").value), period_s: Number($("#period").value), burst: Number($("#burst").value),
    };
    newSession();
  });
  $("#chat-form").addEventListener("submit", (e) => {
    e.preventDefault();
    const text = $("#chat-text").value.trim();
    if (text) post("you", text);
    $("#chat-text").value = "";
  });
  for (const b of document.querySelectorAll("[data-tab]")) b.addEventListener("click", () => showTab(b.dataset.tab));
  await newSession();
  setInterval(streamTick, 50);
  setInterval(poll, 500);
  requestAnimationFrame(draw);
});
