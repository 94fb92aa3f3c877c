// Streaming QA pages: live job progress on the dashboard. The pages work without this file; it
// only refreshes the jobs table (an HTML fragment this server renders) while a job runs.
(function () {
  "use strict";
  function poll(box) {
    var url = box.getAttribute("data-poll");
    function active() {
      var table = box.querySelector("[data-active]");
      return table && table.getAttribute("data-active") === "1";
    }
    function tick() {
      if (document.hidden) { return schedule(); }
      fetch(url, { credentials: "same-origin", headers: { "Accept": "text/html" } })
        .then(function (r) { if (!r.ok) { throw new Error("HTTP " + r.status); } return r.text(); })
        .then(function (html) { box.innerHTML = html; })
        .catch(function () { /* the next tick tries again */ })
        .then(schedule);
    }
    function schedule() { setTimeout(tick, active() ? 1000 : 5000); }
    schedule();
  }
  document.addEventListener("DOMContentLoaded", function () {
    Array.prototype.forEach.call(document.querySelectorAll("[data-poll]"), poll);
  });
})();
