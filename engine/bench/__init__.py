"""engine/bench"""
