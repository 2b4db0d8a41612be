// Small live line charts: the last five minutes of a few series, one sample a poll. Each
// chart's container carries the newest value of every series as data-last-<key> (empty
// when the value is unknown) and the number of samples as data-samples.

const d3 = globalThis.d3;

export const HISTORY_MS = 5 * 60 * 1000;
const PALETTE = d3.schemeTableau10;
const fmt = d3.format(',.4~r');

export class LineChart {
  // series: [{key, label, color}]; with dynamic: true, new keys found in push() become
  // series too (the router's decision reasons).
  constructor(container, { title, unit = '', series = [], dynamic = false, minMax = 1 }) {
    this.container = container;
    this.series = series.map((s, i) => ({ color: PALETTE[i % PALETTE.length], ...s }));
    this.dynamic = dynamic;
    this.minMax = minMax;
    this.samples = [];
    container.classList.add('chart');
    const head = d3.select(container).append('div').attr('class', 'chart-head');
    head.append('span').attr('class', 'chart-title').text(title);
    if (unit) head.append('span').attr('class', 'chart-unit').text(unit);
    this.legend = d3.select(container).append('div').attr('class', 'chart-legend');
    this.svg = d3.select(container).append('svg').attr('class', 'chart-svg');
    this.note = d3.select(container).append('div').attr('class', 'chart-note');
    this.gAxis = this.svg.append('g').attr('class', 'axis');
    this.gLines = this.svg.append('g').attr('class', 'lines');
  }

  // values: {key: number | null}; null marks a gap (unknown, or a counter reset).
  push(t, values) {
    if (this.dynamic) {
      for (const key of Object.keys(values)) {
        if (!this.series.some((s) => s.key === key)) {
          this.series.push({ key, label: key, color: PALETTE[this.series.length % PALETTE.length] });
        }
      }
    }
    this.samples.push({ t, values });
    while (this.samples.length > 0 && this.samples[0].t < t - HISTORY_MS) this.samples.shift();
    for (const s of this.series) {
      const v = values[s.key];
      this.container.setAttribute('data-last-' + s.key, v == null || Number.isNaN(v) ? '' : String(v));
    }
    this.container.setAttribute('data-samples', String(this.samples.length));
  }

  setNote(text) {
    this.note.text(text ?? '');
  }

  render() {
    const width = Math.max(160, this.container.clientWidth - 2);
    const height = 96;
    const m = { l: 44, r: 6, t: 6, b: 18 };
    this.svg.attr('width', width).attr('height', height);
    // The time axis spans the samples kept (at least ten seconds), up to five minutes.
    const now = this.samples.length ? this.samples[this.samples.length - 1].t : Date.now();
    const first = this.samples.length ? this.samples[0].t : now;
    const x = d3.scaleTime().domain([Math.min(first, now - 10 * 1000), now]).range([m.l, width - m.r]);
    let max = this.minMax;
    for (const s of this.samples) {
      for (const k of this.series) {
        const v = s.values[k.key];
        if (v != null && v > max) max = v;
      }
    }
    const y = d3.scaleLinear().domain([0, max]).nice().range([height - m.b, m.t]);
    this.gAxis.selectAll('*').remove();
    this.gAxis.append('g').attr('transform', `translate(0,${height - m.b})`)
      .call(d3.axisBottom(x).ticks(4).tickSizeOuter(0));
    this.gAxis.append('g').attr('transform', `translate(${m.l},0)`)
      .call(d3.axisLeft(y).ticks(3).tickFormat((v) => (Number.isInteger(v) ? d3.format('~s')(v) : d3.format('.2~f')(v))));
    const line = (key) => d3.line()
      .defined((d) => d.values[key] != null && !Number.isNaN(d.values[key]))
      .x((d) => x(d.t))
      .y((d) => y(d.values[key]))(this.samples);
    this.gLines.selectAll('path')
      .data(this.series, (s) => s.key)
      .join('path')
      .attr('stroke', (s) => s.color)
      .attr('d', (s) => line(s.key));
    // The newest value as a dot, so that a series shows from its first sample on.
    const tail = this.samples[this.samples.length - 1];
    const dots = tail ? this.series.filter((k) => tail.values[k.key] != null && !Number.isNaN(tail.values[k.key])) : [];
    this.gLines.selectAll('circle')
      .data(dots, (s) => s.key)
      .join('circle')
      .attr('r', 2.5)
      .attr('fill', (s) => s.color)
      .attr('cx', x(now))
      .attr('cy', (s) => y(tail.values[s.key]));
    const last = this.samples.length ? this.samples[this.samples.length - 1].values : {};
    this.legend.selectAll('span.item')
      .data(this.series, (s) => s.key)
      .join((enter) => {
        const e = enter.append('span').attr('class', 'item');
        e.append('i').attr('class', 'swatch');
        e.append('span').attr('class', 'label');
        e.append('b').attr('class', 'value');
        return e;
      })
      .call((sel) => {
        sel.select('i').style('background', (s) => s.color);
        sel.select('.label').text((s) => s.label + ' ');
        sel.select('.value').text((s) => (last[s.key] == null ? '–' : fmt(last[s.key])));
      });
  }
}

// Turns counters into per-second rates between two polls; null on the first poll and
// when a counter went down (a restart).
export class Rates {
  constructor() {
    this.prev = null;
  }

  next(t, counters) {
    const out = {};
    if (this.prev) {
      const dt = (t - this.prev.t) / 1000;
      for (const [k, v] of Object.entries(counters)) {
        const p = this.prev.counters[k];
        out[k] = v == null || p == null || v < p || dt <= 0 ? null : (v - p) / dt;
      }
    } else {
      for (const k of Object.keys(counters)) out[k] = null;
    }
    this.prev = { t, counters };
    return out;
  }
}
