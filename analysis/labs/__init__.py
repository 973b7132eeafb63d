"""The labs: one experiment per serving mechanism, with its proof (see README.md in analysis/).

| module | job |
|---|---|
| `definitions` | the labs' names and the question each one asks |
| `plan` | validate variants and workload (one variable per comparison), expand the runs, write plan.json |
| `load` | read a lab directory (plan, server logs, scrapes, results) into objects; the judge's only I/O |
| `realtime` | each run's emulator verdict from its own scrapes (the quick map's judge), per variant |
| `figures` | each lab's figures in emulated units (statistic and unit in every key) |
| `verdicts` | each lab's verdict as a pure function of its figures |
| `judge` | figures + evidence + verdict + pitfalls -> lab.json |
| `plots` | gap timeline, TPOT distribution, KV timeline, TTFT by ISL |
| `report` | labs/report.md in the Goal · Setup · Observation · Conclusion · Pitfalls template |
| `cli` | `python -m analysis labs plan / inject-rate / judge / report` |
"""
