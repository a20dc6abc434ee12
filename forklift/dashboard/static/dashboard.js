// forklift dashboard: the live parts of a page. Every element with data-live="URL" is
// fetched again every data-every milliseconds while the page is visible, and its contents
// replaced by the answer (HTML the server rendered and escaped; a <template> never runs
// scripts, and the Content-Security-Policy allows none inline). An answer that fails
// leaves the old contents, marked stale, and the next round tries again.
(function () {
  "use strict";

  function schedule(el) {
    window.setTimeout(function () { refresh(el); }, Number(el.dataset.every || 1000));
  }

  function refresh(el) {
    if (document.hidden) {
      schedule(el);
      return;
    }
    fetch(el.dataset.live, { credentials: "same-origin", cache: "no-store" })
      .then(function (response) {
        if (!response.ok) {
          throw new Error(String(response.status));
        }
        return response.text();
      })
      .then(function (html) {
        var template = document.createElement("template");
        template.innerHTML = html;
        el.replaceChildren(template.content);
        el.classList.remove("stale");
        el.dataset.refreshed = String(Date.now());
      })
      .catch(function (error) {
        el.classList.add("stale");
        el.dataset.failed = String(error.message || error);
      })
      .finally(function () { schedule(el); });
  }

  document.addEventListener("DOMContentLoaded", function () {
    document.querySelectorAll("[data-live]").forEach(schedule);
  });
})();
