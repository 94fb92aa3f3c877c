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
        .then(function (r) {
          if (r.redirected) { throw new Error("login"); }  // the session ended: the login page came back
          if (!r.ok) { throw new Error("HTTP " + r.status); }
          return r.text();
        })
        .then(function (html) { box.innerHTML = html; schedule(); })
        .catch(function (err) {
          if (err.message === "login") {
            box.insertAdjacentHTML("afterbegin", '<p class="error" role="alert">Your session has ended: ' +
              '<a href="/dashboard/login">log in again</a> to follow the jobs.</p>');
            return;  // stop polling
          }
          schedule();  // a network blip: the next tick tries again
        });
    }
    function schedule() { setTimeout(tick, active() ? 1000 : 5000); }
    schedule();
  }
  document.addEventListener("DOMContentLoaded", function () {
    Array.prototype.forEach.call(document.querySelectorAll("[data-poll]"), poll);
  });
})();
