"""lower: each op call becomes its planned algorithm's products and pointwise steps (``plan``, ``apply``)."""
