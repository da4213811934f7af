"""In the grader's own process: student code never runs here. It reads a sandbox's records as data.

``collect`` files submissions; ``sandbox`` starts and watches the sandboxed worker (``watchdog``);
``unwire`` reads the records it sends back, refusing anything but plain data; ``verdicts`` makes
the answer key and judges each record against it; ``mistakes`` names known mistakes; ``grade``
runs a class; ``gradebook``, ``feedback``, ``flags`` and ``similarity`` report.
"""
