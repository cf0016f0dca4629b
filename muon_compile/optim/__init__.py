"""The optimizers users construct: Muon and MuonAdamW, their update rules, stacked state, offload,
QK-clip and the usual parameter groups."""
