"""One module per lab subject, built on the layers below (engines, measure, results).

anchors (lab 03), compare and cases (04), serving (05), quant, quality and ladder (06),
roofline (07), prefix (08). Their figures are in :mod:`lablib.plots`, their commands in :mod:`lablib.cli`.
"""
