// jailbox view's only script, served from the viewer's own origin (its CSP allows no other).
// It sorts and filters a batch's table and polls a batch still running; it never puts a record's text
// into the page as markup: the server escaped every fragment it sends (see agent/view/html.py).
"use strict";

(function () {
  const sortState = { column: -1, descending: false };

  function cellValue(row, column, numeric) {
    const cell = row.cells[column];
    const value = cell ? cell.getAttribute("data-v") || "" : "";
    return numeric ? parseFloat(value) || 0 : value.toLowerCase();
  }

  function sortTable(table) {
    if (sortState.column < 0) return;
    const th = table.tHead.rows[0].cells[sortState.column];
    const numeric = th.hasAttribute("data-num");
    const body = table.tBodies[0];
    const rows = Array.from(body.rows);
    rows.sort(function (a, b) {
      const x = cellValue(a, sortState.column, numeric);
      const y = cellValue(b, sortState.column, numeric);
      const order = x < y ? -1 : x > y ? 1 : 0;
      return sortState.descending ? -order : order;
    });
    body.replaceChildren.apply(body, rows);
    Array.from(table.tHead.rows[0].cells).forEach(function (cell, i) {
      cell.setAttribute("aria-sort", i === sortState.column ? (sortState.descending ? "descending" : "ascending") : "none");
    });
  }

  function filterTable(table) {
    const words = (document.getElementById("filter") || { value: "" }).value.toLowerCase();
    const outcome = (document.getElementById("outcome") || { value: "" }).value;
    let shown = 0;
    Array.from(table.tBodies[0].rows).forEach(function (row) {
      const keep = (!outcome || row.getAttribute("data-outcome") === outcome) &&
        (!words || row.textContent.toLowerCase().indexOf(words) >= 0);
      row.hidden = !keep;
      if (keep) shown += 1;
    });
    table.setAttribute("data-shown", String(shown));
  }

  function wire() {
    const table = document.getElementById("batch");
    if (!table) return;
    Array.from(table.tHead.rows[0].cells).forEach(function (th, i) {
      th.addEventListener("click", function () {
        sortState.descending = sortState.column === i ? !sortState.descending : th.hasAttribute("data-num");
        sortState.column = i;
        sortTable(table);
      });
    });
    sortTable(table);
    filterTable(table);
  }

  function poll(live) {
    const url = live.getAttribute("data-poll");
    if (!url) return;
    setInterval(function () {
      fetch(url + "&stamp=" + encodeURIComponent(live.getAttribute("data-stamp") || ""), { credentials: "omit" })
        .then(function (reply) { return reply.ok ? reply.json() : null; })
        .then(function (data) {
          if (!data || data.html === undefined) return;
          // a fragment the server rendered, every record's text escaped there; parsed inert, then moved in
          const doc = new DOMParser().parseFromString("<body>" + data.html + "</body>", "text/html");
          live.replaceChildren.apply(live, Array.from(doc.body.firstChild.childNodes));
          live.setAttribute("data-stamp", data.stamp);
          live.setAttribute("data-updates", String((parseInt(live.getAttribute("data-updates"), 10) || 0) + 1));
          wire();
        })
        .catch(function () { /* the viewer stopped: the page keeps what it has */ });
    }, 1000);
  }

  document.addEventListener("DOMContentLoaded", function () {
    wire();
    ["filter", "outcome"].forEach(function (id) {
      const input = document.getElementById(id);
      if (!input) return;
      ["input", "change"].forEach(function (kind) {
        input.addEventListener(kind, function () { filterTable(document.getElementById("batch")); });
      });
    });
    const live = document.getElementById("live");
    if (live) poll(live);
  });
})();
