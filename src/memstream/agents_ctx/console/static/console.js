// The overview's lag chart: polls /console/overview/lag.json and redraws a uPlot chart.
(function () {
  "use strict";
  var el = document.getElementById("lag-chart");
  if (!el || typeof uPlot === "undefined") return;
  var plot = null, names = "";
  var palette = ["#0550ae", "#cf222e", "#1a7f37", "#8250df", "#bf8700", "#0a7ea4", "#d1242f", "#57606a"];
  function width() { return Math.max(280, el.clientWidth || 600); }
  function draw(d) {
    var keys = Object.keys(d.series);
    var data = [d.ts].concat(keys.map(function (k) { return d.series[k]; }));
    if (!plot || names !== keys.join("|")) {
      if (plot) plot.destroy();
      names = keys.join("|");
      plot = new uPlot({
        width: width(), height: 260,
        series: [{}].concat(keys.map(function (k, i) {
          return { label: k, stroke: palette[i % palette.length], width: 2, spanGaps: true };
        })),
        axes: [{}, { label: "lag (records)" }]
      }, data, el);
    } else {
      plot.setData(data);
    }
  }
  function poll() {
    fetch("/console/overview/lag.json", { credentials: "same-origin" })
      .then(function (r) { return r.ok ? r.json() : null; })
      .then(function (d) { if (d) draw(d); })
      .catch(function () {});
  }
  window.addEventListener("resize", function () { if (plot) plot.setSize({ width: width(), height: 260 }); });
  poll();
  setInterval(poll, 2000);
})();
