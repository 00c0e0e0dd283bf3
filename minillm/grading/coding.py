PRESSURE_SCENARIOS={}
def show_scenarios(): pass
