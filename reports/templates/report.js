// kernel-lab report: draws the matrix from the inline records, filters it, shows a record on click.
// Record layout: see reports/matrix.py. No network access, no libraries.
"use strict";
(function () {
  const D = JSON.parse(document.getElementById("report-data").textContent);
  const S = D.statuses, STR = D.strings;
  const R = {cell: 0, row: 1, status: 2, margin: 3, dur: 4, seed: 5, reason: 6, model: 7, tol: 8, extra: 9, outputs: 10, quality: 11, decided: 12};
  const BUCKETS = [[0.01, "margin < 0.01"], [0.1, "0.01 – 0.1"], [0.5, "0.1 – 0.5"], [0.9, "0.5 – 0.9"], [Infinity, "≥ 0.9 (close to failing)"]];
  const LABEL = {pass: "pass", fail: "fail", skip: "skip", xfail: "xfail (known failure)", xpass: "xpass (known failure passed)",
                 error: "error (exception)", crash: "crash (worker died)"};
  const BAD = new Set(["fail", "error", "crash", "xpass"]);
  const state = {hidden: new Set(), backend: "", text: "", groupBy: {}, axisFilter: {}};
  const root = document.body;
  const esc = (s) => String(s).replace(/[&<>"']/g, (c) => ({"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;"})[c]);
  const str = (i) => (i === null || i === undefined ? null : STR[i]);
  const fmt = (x) => (typeof x === "number" ? (Number.isInteger(x) ? String(x) : x.toPrecision(3)) : x === null || x === undefined ? "–" : String(x));

  function passBucket(m) {
    if (typeof m !== "number") return 0;
    for (let i = 0; i < BUCKETS.length; i++) if (m < BUCKETS[i][0]) return i;
    return BUCKETS.length - 1;
  }
  const isNI = (rec) => rec[R.extra] !== null && STR[rec[R.extra]].indexOf('"not_implemented": true') >= 0;
  function markClass(rec) {
    const s = S[rec[R.status]];
    let c = "m st-" + s;
    if (s === "pass") c += " p" + passBucket(rec[R.margin]);
    if (s === "skip" && isNI(rec)) c += " ni";
    return c;
  }

  // ---------------------------------------------------------------- grouping
  const families = new Map();  // family -> {ops: Map(op -> [cellIdx]), rows: Set, axes: Map(axis -> Set(values))}
  const byCellRow = new Map(); // cellIdx*nRows+row -> rec index
  const nRows = D.rows.length;
  D.cells.forEach((c, i) => {
    let f = families.get(c[1]);
    if (!f) families.set(c[1], f = {ops: new Map(), rows: new Set(), axes: new Map()});
    if (!f.ops.has(c[2])) f.ops.set(c[2], []);
    f.ops.get(c[2]).push(i);
    for (const [k, v] of Object.entries(c[3])) {
      if (!f.axes.has(k)) f.axes.set(k, new Set());
      f.axes.get(k).add(JSON.stringify(v));
    }
  });
  // default grouping: the axis most of the family's cells have (e.g. GDN's state dtype)
  for (const f of families.values()) {
    const have = new Map();
    for (const cells of f.ops.values()) for (const ci of cells) for (const k of Object.keys(D.cells[ci][3])) have.set(k, (have.get(k) || 0) + 1);
    f.defaultAxis = [...have.entries()].reduce((best, e) => (e[1] > best[1] ? e : best), ["", 0])[0];
  }
  D.recs.forEach((r, i) => {
    byCellRow.set(r[R.cell] * nRows + r[R.row], i);
    families.get(D.cells[r[R.cell]][1]).rows.add(r[R.row]);
  });
  const valueOrder = (a, b) => {
    const x = JSON.parse(a), y = JSON.parse(b);
    if (typeof x === "number" && typeof y === "number") return x - y;
    return String(x).localeCompare(String(y), undefined, {numeric: true});
  };

  // ---------------------------------------------------------------- controls
  function buildLegend() {
    let h = '<span class="flabel">colours</span>';
    BUCKETS.forEach((b, i) => { h += `<span class="lg"><i class="m st-pass p${i}"></i>pass, ${esc(b[1])}</span>`; });
    S.filter((s) => s !== "pass").forEach((s) => { h += `<span class="lg"><i class="m st-${s}"></i>${esc(LABEL[s])}</span>`; });
    h += '<span class="lg"><i class="m st-skip ni"></i>skip: op not implemented by the backend</span>';
    document.getElementById("legend").innerHTML = h;
    const counts = S.map(() => 0);
    D.recs.forEach((r) => counts[r[R.status]]++);
    document.getElementById("f-status").innerHTML = S.map((s, i) =>
      `<label class="stbox"><input type="checkbox" data-status="${s}" checked><i class="m st-${s}${s === "pass" ? " p1" : ""}"></i>${s} <span class="n">${counts[i]}</span></label>`).join("");
    const sel = document.getElementById("f-backend");
    D.rows.forEach((r, i) => sel.insertAdjacentHTML("beforeend", `<option value="${i}">${esc(r.label)}</option>`));
  }

  function applyStatusFilter() {
    S.forEach((s) => root.classList.toggle("hide-" + s, state.hidden.has(s)));
    updateCount();
  }
  function updateCount() {
    let shown = document.querySelectorAll("#families .m").length;
    document.querySelectorAll("#families .niline").forEach((el) => { shown += +el.dataset.n; });
    let visible = 0;
    document.querySelectorAll("#families .m").forEach((el) => { if (!state.hidden.has(el.dataset.s)) visible++; });
    if (!state.hidden.has("skip")) visible += shown - document.querySelectorAll("#families .m").length;
    document.getElementById("f-count").textContent = `showing ${visible} of the ${D.recs.length} records of available backends` + (shown < D.recs.length ? ` (${D.recs.length - shown} filtered out by backend, id or axis)` : "");
  }

  // ---------------------------------------------------------------- drawing
  function cellVisible(ci, fam) {
    const c = D.cells[ci];
    if (state.text) {
      for (const t of state.text.split(/\s+/)) if (t && c[0].indexOf(t) < 0) return false;
    }
    const af = state.axisFilter[fam];
    if (af) { const [k, v] = af; if (JSON.stringify(c[3][k]) !== v) return false; }
    return true;
  }

  // the shared start of several group values, cut after its last '_' or '-' (e.g. "turboquant_")
  function commonPrefix(values) {
    if (values.length < 2) return "";
    let p = values[0];
    for (const v of values) while (!v.startsWith(p)) p = p.slice(0, -1);
    const cut = Math.max(p.lastIndexOf("_"), p.lastIndexOf("-"));
    return cut > 0 ? p.slice(0, cut + 1) : "";
  }

  function drawFamily(fam, f) {
    const rows = [...f.rows].filter((r) => state.backend === "" || String(r) === state.backend).sort((a, b) => D.rows[a].label.localeCompare(D.rows[b].label));
    const axes = [...f.axes.keys()];
    const gb = state.groupBy[fam] !== undefined ? state.groupBy[fam] : f.defaultAxis;
    let ops = "";
    let n = 0;
    for (const [op, cellIdx] of f.ops) {
      const cols = cellIdx.filter((ci) => cellVisible(ci, fam));
      if (!cols.length || !rows.length) continue;
      // an op without the chosen axis is grouped by its own first axis
      const opAxes = Object.keys(D.cells[cols[0]][3]);
      const key = opAxes.includes(gb) ? gb : (opAxes[0] || "");
      const groups = new Map();
      for (const ci of cols) {
        const v = key in D.cells[ci][3] ? JSON.stringify(D.cells[ci][3][key]) : '"(none)"';
        if (!groups.has(v)) groups.set(v, []);
        groups.get(v).push(ci);
      }
      // backends that implement none of the op (every record a not-implemented skip): one line, no row
      const counts = new Map(rows.map((r) => [r, [0, 0]]));
      for (const ci of cols) {
        for (const r of rows) {
          const ri = byCellRow.get(ci * nRows + r);
          if (ri !== undefined) { const c = counts.get(r); c[0]++; if (isNI(D.recs[ri])) c[1]++; }
        }
      }
      const absent = rows.filter((r) => counts.get(r)[0] > 0 && counts.get(r)[0] === counts.get(r)[1]);
      const opRows = rows.filter((r) => !absent.includes(r));
      const nAbsent = absent.reduce((a, r) => a + counts.get(r)[0], 0);
      const absentLine = absent.length ? `<p class="niline" data-n="${nAbsent}">Not implemented by ${absent.map((r) => esc(D.rows[r].label)).join(", ")}: ${nAbsent} skip record${nAbsent === 1 ? "" : "s"}, not drawn.</p>` : "";
      let g = "";
      const bad = new Map(opRows.map((r) => [r, 0]));
      const values = [...groups.keys()].sort(valueOrder);
      const shown = values.map((v) => String(JSON.parse(v)));
      const prefix = commonPrefix(shown);
      values.forEach((v, vi) => {
        let colsHtml = "";
        const members = groups.get(v);
        for (const ci of members) {
          let col = "";
          for (const r of opRows) {
            const ri = byCellRow.get(ci * nRows + r);
            if (ri === undefined) { col += '<b class="gap"></b>'; continue; }
            n++;
            const st = S[D.recs[ri][R.status]];
            if (BAD.has(st)) bad.set(r, bad.get(r) + 1);
            col += `<i class="${markClass(D.recs[ri])}" data-i="${ri}" data-s="${st}"></i>`;
          }
          colsHtml += `<span class="col">${col}</span>`;
        }
        const text = shown[vi].slice(prefix.length) || shown[vi];
        const wide = members.length * 13 >= text.length * 6.5 + 4 ? " wide" : "";
        g += `<span class="grp"><span class="glabel${wide}" title="${esc(key + "=" + shown[vi])}">${esc(text)}</span><span class="cols">${colsHtml}</span></span>`;
      });
      const labels = opRows.map((r) => `<div class="rlabel" title="${esc(D.rows[r].label)}"><span>${esc(D.rows[r].label)}</span>` +
        (bad.get(r) ? `<b class="nbad" title="fail, error, crash or xpass">${bad.get(r)}</b>` : "") + "</div>").join("");
      const short = g.indexOf('glabel"') < 0 ? " short" : "";
      ops += `<div class="op${short}"><div class="oplabel">${esc(fam)} / ${esc(op)} <span class="n">${cols.length} cells, columns grouped by ${esc(key)}${prefix ? ` (values start with ${esc(prefix)})` : ""}</span></div>
        ${opRows.length ? `<div class="hm"><div class="rlabels">${labels}</div><div class="scroller"><div class="grps">${g}</div></div></div>` : ""}${absentLine}</div>`;
    }
    const opts = axes.map((a) => `<option ${a === gb ? "selected" : ""}>${esc(a)}</option>`).join("");
    let filt = '<option value="">all cells</option>';
    for (const a of axes) {
      filt += `<optgroup label="${esc(a)}">` + [...f.axes.get(a)].sort(valueOrder).map((v) => {
        const key = JSON.stringify([a, v]);
        const cur = state.axisFilter[fam] && JSON.stringify(state.axisFilter[fam]) === key;
        return `<option value="${esc(key)}" ${cur ? "selected" : ""}>${esc(a)}=${esc(JSON.parse(v))}</option>`;
      }).join("") + "</optgroup>";
    }
    return `<div class="family" data-family="${esc(fam)}">
      <h3>${esc(fam)} <span class="n">${n} records shown</span></h3>
      <div class="famctl"><span class="flabel">group columns by</span><select class="groupby">${opts}</select>
        <span class="flabel">only cells with</span><select class="axisfilter">${filt}</select></div>
      ${ops || '<p class="missing">No record matches the filters.</p>'}
    </div>`;
  }

  function draw() {
    const t0 = performance.now();
    let h = "";
    for (const [fam, f] of families) h += drawFamily(fam, f);
    document.getElementById("families").innerHTML = h;
    updateCount();
    document.body.dataset.drawMs = (performance.now() - t0).toFixed(1);
  }

  // ---------------------------------------------------------------- details
  // as conformance/run/repro.py: the id escaped and anchored for --filter (a captured cell: its --inputs file), each
  // argument as shlex.quote quotes it
  const shq = (a) => (a === "" ? "''" : /[^\w@%+=:,.\/-]/.test(a) ? "'" + a.replace(/'/g, `'"'"'`) + "'" : a);
  function repro(rec) {
    const c = D.cells[rec[R.cell]];
    const run = D.runs[D.rows[rec[R.row]].run];
    const args = ["kernel-lab", "conform"];
    if (run.inputs) {   // a cell of captured tensors: the file names it
      const [family, op] = c[0].split("/");
      return [...args, "--inputs", run.inputs, "--family", family, "--op", op, "--backend", D.rows[rec[R.row]].backend]
        .map(shq).join(" ");
    }
    for (const [flag, v] of [["--tier", run.tier], ["--model", run.model], ["--config", run.config]]) if (v) args.push(flag, v);
    args.push("--filter", "^" + c[0].replace(/[.*+?^${}()|[\]\\]/g, "\\$&") + "$", "--backend", D.rows[rec[R.row]].backend);
    return args.map(shq).join(" ");
  }
  function jsonBlock(s) {
    if (s === null) return "–";
    try { return `<pre>${esc(JSON.stringify(JSON.parse(s), null, 1))}</pre>`; } catch (e) { return `<pre>${esc(s)}</pre>`; }
  }
  function showDetails(i) {
    const rec = D.recs[i];
    const c = D.cells[rec[R.cell]];
    const s = S[rec[R.status]];
    const row = D.rows[rec[R.row]];
    let tol = {};
    try { tol = JSON.parse(str(rec[R.tol]) || "{}"); } catch (e) { tol = {}; }
    let outs = "";
    if (rec[R.outputs].length) {
      const keys = D.metric_keys;
      outs = `<div class="scrollx"><table class="grid small"><tr><th>output</th>${keys.map((k) => `<th>${esc(k)}</th>`).join("")}</tr>` +
        rec[R.outputs].map((o) => `<tr><td>${esc(STR[o[0]])}</td>${keys.map((k, j) => `<td>${esc(fmt(o[j + 1]))}</td>`).join("")}</tr>`).join("") + "</table></div>";
    } else {
      outs = '<p class="missing">No per-output metrics in this record (it did not run, or the record predates them).</p>';
    }
    const extra = str(rec[R.extra]);
    const cmd = repro(rec);
    document.getElementById("details-body").innerHTML = `
      <h3><span class="badge st-${s}">${esc(s)}</span> ${esc(row.label)}</h3>
      <p class="cid"><code>${esc(c[0])}</code></p>
      <div class="repro"><div class="flabel">reproduce</div><code id="repro-cmd">${esc(cmd)}</code>
        <button id="copy-repro">copy</button></div>
      <table class="kv">
        <tr><th>reason</th><td class="reason">${esc(str(rec[R.reason]) || "–")}</td></tr>
        <tr><th>rounding model</th><td>${esc(str(rec[R.model]) || "missing")}</td></tr>
        <tr><th>seed</th><td>${esc(fmt(rec[R.seed]))}</td></tr>
        <tr><th>duration</th><td>${typeof rec[R.dur] === "number" ? esc(fmt(rec[R.dur])) + " s" : "missing"}</td></tr>
        <tr><th>margin</th><td id="margin">${esc(fmt(rec[R.margin]))}${str(rec[R.decided]) ? ` <strong>${esc(str(rec[R.decided]))}</strong>` : ""} <span class="help">(largest ratio of an error to its bound over every criterion: elementwise, mismatch fraction, rel_l2; at most 1 passes)</span></td></tr>
        <tr><th>tolerance</th><td>${rec[R.tol] === null ? "missing" : `atol ${esc(fmt(tol.atol))}, rtol ${esc(fmt(tol.rtol))}, max mismatch ${esc(fmt(tol.max_mismatch))}, rel_l2 ${esc(fmt(tol.rel_l2))}<br><span class="src">${esc(tol.source || "source missing")}</span>`}</td></tr>
        <tr><th>run</th><td>${esc(D.runs[row.run].name)} (tier ${esc(c[4] || "unknown")})</td></tr>
        <tr><th>axes</th><td>${Object.entries(c[3]).map(([k, v]) => `${esc(k)}=${esc(v)}`).join(" ")}</td></tr>
      </table>
      <h4>Metrics per output</h4>${outs}
      <h4>Quality (secondary errors)</h4>${jsonBlock(str(rec[R.quality]))}
      ${extra ? `<h4>Other fields</h4>${jsonBlock(extra)}` : ""}`;
    const panel = document.getElementById("details");
    panel.hidden = false;
    document.getElementById("copy-repro").onclick = () => navigator.clipboard && navigator.clipboard.writeText(cmd).catch(() => {});
    document.querySelectorAll("#families .m.sel").forEach((el) => el.classList.remove("sel"));
    const el = document.querySelector(`#families .m[data-i="${i}"]`);
    if (el) el.classList.add("sel");
  }

  // ---------------------------------------------------------------- events
  buildLegend();
  draw();
  document.getElementById("f-status").addEventListener("change", (e) => {
    const s = e.target.dataset.status;
    if (e.target.checked) state.hidden.delete(s); else state.hidden.add(s);
    applyStatusFilter();
  });
  document.getElementById("f-backend").addEventListener("change", (e) => { state.backend = e.target.value; draw(); });
  let timer = null;
  document.getElementById("f-text").addEventListener("input", (e) => {
    clearTimeout(timer);
    timer = setTimeout(() => { state.text = e.target.value.trim(); draw(); }, 200);
  });
  const fams = document.getElementById("families");
  fams.addEventListener("change", (e) => {
    const fam = e.target.closest(".family").dataset.family;
    if (e.target.classList.contains("groupby")) state.groupBy[fam] = e.target.value;
    if (e.target.classList.contains("axisfilter")) {
      if (e.target.value) { const [k, v] = JSON.parse(e.target.value); state.axisFilter[fam] = [k, v]; } else delete state.axisFilter[fam];
    }
    draw();
  });
  fams.addEventListener("click", (e) => { if (e.target.classList.contains("m") && e.target.dataset.i) showDetails(+e.target.dataset.i); });
  fams.addEventListener("mouseover", (e) => {
    const t = e.target;
    if (t.classList.contains("m") && t.dataset.i && !t.title) {
      const rec = D.recs[+t.dataset.i];
      t.title = `${D.cells[rec[R.cell]][0]}\n${D.rows[rec[R.row]].label}: ${S[rec[R.status]]}` + (typeof rec[R.margin] === "number" ? `, margin ${fmt(rec[R.margin])}` : "") + (str(rec[R.decided]) ? ` (${str(rec[R.decided])})` : "");
    }
  });
  document.getElementById("details-close").addEventListener("click", () => { document.getElementById("details").hidden = true; });
  document.addEventListener("keydown", (e) => { if (e.key === "Escape") document.getElementById("details").hidden = true; });
})();
