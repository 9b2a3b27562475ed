"""Drop-ins for other Nyström-attention packages, running on nystrom's core.

``nystrom.compat.lucidrains``: ``NystromAttention`` and ``Nystromformer`` of lucidrains' ``nystrom-attention``.
"""
